"""Calibrate σ so that ε(σ, T) ≤ target under one accountant, never above it.

Bisection on σ (ε decreases in σ), returning the upper end of the final bracket, whose ε was computed with the
same accountant and the same integer T that training runs. Every ε it uses is a checked one
(:func:`dplora.accounting.checked.checked_curve` at T): a numerical accountant is asked only inside its cost
and δ range, and under add/remove its answer is floored by RDP, so ε(σ) ≤ ε_RDP(σ) and the bracket starts at
[0.8·σ_RDP, σ_RDP] (the fast path of ``../shared/NOTES.md``), widened when needed. After the bisection the
(σ, ε) pairs it evaluated must be non-increasing in σ within the tolerance's slack; if not, it raises
:class:`AccountingNumericalError` and the plan falls back. The σ found is cached on disk, keyed by the accountant
chain, library versions, adjacency, q, T, δ, target, tolerance and the rule version. A cached σ is a starting
answer only, since the cache file is writable by whoever shares the folder and the ε returned is stated (the
planner's table, the record): it is used only where a fresh calibration could have ended, checked with three
computed ε (at σ, one rtol below it and 1 % above it). A calibration that ends with a note (the tolerance not
reached) is not cached: a note read from the file would be free text in the record.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dplora.accounting import cache, registry
from dplora.accounting.backends import AccountingNumericalError, accountant_version
from dplora.accounting.cache import RULE_VERSION
from dplora.accounting.checked import (
    FLOOR,
    SIGMA_PROBE,
    OutOfRangeError,
    checked_curve,
    numerical_chain,
    sigma_problem,
)
from dplora.accounting.cost import tolerance_for
from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent
from dplora.errors import PlanRefusedError

__all__ = ["SIGMA_MAX", "SIGMA_MIN", "calibrate"]

SIGMA_MAX = 1e4
SIGMA_MIN = 1e-3


def _cache_key(chain, adjacency, q, steps, delta, target) -> str:
    versions = sorted({accountant_version(a) for a in (*chain, FLOOR)})
    names = "+".join(registry.get(a).name for a in chain) or FLOOR.value
    parts = [RULE_VERSION, names, *versions, adjacency.value, repr(q), str(steps), repr(delta)]
    return "|".join([*parts, repr(target), tolerance_for(target).key()])


def _cached_sigma(key: str) -> float | None:
    """The σ cached under ``key`` if it is a number in [SIGMA_MIN, SIGMA_MAX] (else None; nothing else is read)."""
    hit = cache.load().get(key)
    sigma = hit.get("noise_multiplier") if isinstance(hit, dict) else None
    if not isinstance(sigma, (int, float)) or isinstance(sigma, bool):
        return None
    return float(sigma) if SIGMA_MIN <= sigma <= SIGMA_MAX else None


def _cache_store(key: str, sigma: float, eps: float) -> None:
    cache.put(key, {"noise_multiplier": sigma, "epsilon": eps})  # ε kept for a reader's eye only: never read


def _bisect(eps_of: Callable[[float], float], target: float, lo: float, hi: float, rtol: float) -> tuple[float, float]:
    """Given ε(lo) > target ≥ ε(hi), shrink the bracket to rtol; return (σ, ε) at the upper end."""
    eps_hi = eps_of(hi)
    while (hi - lo) > rtol * hi:
        mid = math.sqrt(lo * hi) if hi / lo > 4 else 0.5 * (lo + hi)
        eps_mid = eps_of(mid)
        if eps_mid <= target:
            hi, eps_hi = mid, eps_mid
        else:
            lo = mid
    return hi, eps_hi


def _bracket(eps_of, target, start: float, accountant: Accountant | str, event_desc: str) -> tuple[float, float]:
    """Find lo < hi with ε(lo) > target ≥ ε(hi), starting from a guess σ = start."""
    account = registry.get(accountant)
    hi = start
    while eps_of(hi) > target:
        hi *= 2.0
        if hi > SIGMA_MAX:
            raise PlanRefusedError(
                f"target ε={target} cannot be reached with accountant={account.name} for {event_desc} even at "
                f"σ={SIGMA_MAX:g}." + account.refusal_hint
            )
    lo = hi / 1.25
    while eps_of(lo) <= target:
        hi, lo = lo, lo / 1.25
        if lo < SIGMA_MIN:
            return SIGMA_MIN, SIGMA_MIN
    return lo, hi


def calibrate(
    *,
    target_epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: Accountant,
    adjacency: Adjacency,
    chain: tuple[Accountant, ...] | None = None,
    notes: list[str] | None = None,
) -> tuple[float, float]:
    """Smallest σ (to the accountant's rtol) with checked ε(σ, T) ≤ target; returns (σ, ε(σ, T)).

    When the bisection's lower end is a σ where the accountant is outside its checked range (replace-one: no
    trusted ε there), the σ returned meets the target but is not within rtol of the root: the calibration did not
    reach its tolerance, and a note saying so (with the reason) is appended to ``notes`` (the plan's
    ``accountant_note``) instead of returning the loose σ silently.

    Args:
        target_epsilon, sample_rate, steps, delta, adjacency: the contract's numbers.
        accountant: the contract's accountant (a registry name, :mod:`dplora.accounting.registry`).
        chain: the numerical accountants to try (default :func:`numerical_chain`); ``()`` means RDP alone.
        notes: a list that receives a note when the tolerance was not reached.

    Raises:
        BadInputError: no accountant of that name is registered (:func:`dplora.accounting.registry.get`).
        PlanRefusedError: the target cannot be reached (e.g. ε < 0.1 with RDP).
        UnsupportedAccountingError: RDP or PRV asked for replace-one.
        AccountingNumericalError: the checked ε was not non-increasing in σ.
    """
    accountant, adjacency = registry.key(accountant), Adjacency(adjacency)
    chain = numerical_chain(accountant, adjacency) if chain is None else tuple(chain)
    if steps == 0:
        return SIGMA_MIN, 0.0
    key = _cache_key(chain, adjacency, sample_rate, steps, delta, target_epsilon)
    tolerance = tolerance_for(target_epsilon)
    rtol = registry.get(chain[0] if chain else FLOOR).rtol
    memo: dict[float, float] = {}
    range_errors: list[OutOfRangeError] = []
    out_of_range: dict[float, str] = {}  # σ → why no trusted ε there

    def eps_of(sigma: float) -> float:
        if sigma not in memo:
            event = DpSgdEvent(sample_rate=sample_rate, noise_multiplier=sigma, steps=steps, adjacency=adjacency)
            try:
                memo[sigma] = checked_curve(event, delta, chain, [steps], tolerance).epsilons[-1]
            except OutOfRangeError as err:
                memo[sigma] = math.inf  # replace-one: no trusted ε at this σ; look at larger σ
                range_errors.append(err)
                out_of_range[sigma] = str(err)
        return memo[sigma]

    cached = _cached_sigma(key)
    if cached is not None:
        # Taken only where a fresh calibration could have ended, every ε computed here: its ε meets the target, ε
        # one rtol below it does not and has a trusted value there (the root to rtol, where a fresh run would have
        # no note; not a σ edited up), and ε does not rise when σ grows by 1 % (the probe a given σ gets).
        below, above = cached * (1.0 - rtol), cached * SIGMA_PROBE
        try:
            eps, eps_below, eps_above = eps_of(cached), eps_of(below), eps_of(above)
        except (AccountingNumericalError, ArithmeticError, ValueError):
            eps = eps_below = eps_above = math.nan
        holds = eps <= target_epsilon < eps_below < math.inf and below not in out_of_range  # NaN fails each test
        if holds and sigma_problem([(cached, eps), (above, eps_above)], tolerance.slack) is None:
            return cached, eps
        memo.clear()
        range_errors.clear()
        out_of_range.clear()

    desc = f"q={sample_rate:g}, T={steps}, δ={delta:g}"
    start = 1.0
    if chain and adjacency is Adjacency.ADD_REMOVE:
        try:  # the checked ε is floored by RDP, so σ_RDP always meets the target
            start, _ = calibrate(
                target_epsilon=target_epsilon,
                sample_rate=sample_rate,
                steps=steps,
                delta=delta,
                accountant=FLOOR,
                adjacency=adjacency,
            )
        except PlanRefusedError:
            start = 1.0
    if chain and eps_of(start) <= target_epsilon and eps_of(0.8 * start) > target_epsilon:
        lo, hi = 0.8 * start, start
    else:
        try:
            lo, hi = _bracket(eps_of, target_epsilon, start, chain[0] if chain else FLOOR, desc)
        except PlanRefusedError:
            if range_errors:  # say why PLD could not be used rather than "unreachable"
                raise range_errors[-1] from None
            raise
    if lo == hi:  # even σ = SIGMA_MIN meets the target
        sigma, eps = hi, eps_of(hi)
    else:
        sigma, eps = _bisect(eps_of, target_epsilon, lo, hi, rtol)
    # Re-check with the same accountant and integer T; step σ up if a numerical wobble put ε above target.
    while eps > target_epsilon:
        sigma *= 1.0 + rtol
        eps = eps_of(sigma)
    problem = sigma_problem(list(memo.items()), tolerance.slack)
    if problem is not None:
        raise AccountingNumericalError(problem)
    note = _loose_note(memo, out_of_range, sigma, eps, target_epsilon, rtol)
    if note:
        if notes is not None:
            notes.append(note)
    else:
        _cache_store(key, sigma, eps)
    return sigma, eps


def _loose_note(memo, out_of_range, sigma: float, eps: float, target: float, rtol: float) -> str | None:
    """The note for a σ whose lower neighbour had no trusted ε (None when the bracket closed on ε > target)."""
    below = [s for s in memo if s < sigma]
    if not below or max(below) not in out_of_range:
        return None
    lo = max(below)
    return (
        f"calibration did not reach its tolerance (rtol {rtol:g}): σ={sigma:.4g} gives ε={eps:.4g} for target "
        f"{target:g}, but below σ={lo:.4g} the accountant has no trusted ε ({out_of_range[lo]}), so a smaller σ "
        "may also meet the target"
    )
