"""Calibrate σ so that ε(σ, T) ≤ target under one accountant, never above it.

Bisection on σ (ε decreases in σ), returning the upper end of the final bracket, whose ε was computed with the
same accountant and the same integer T that training runs. For PRV and PLD the bracket starts at
[0.8·σ_RDP, σ_RDP]: for this mechanism PRV/PLD ε ≤ RDP ε, so σ_PLD ≤ σ_RDP (the fast path of
``../shared/NOTES.md``); the bracket is widened when that does not hold. Results are cached on disk, keyed by
(accountant, version, adjacency, q, T, δ, target).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from dplora.accounting.backends import accountant_version, epsilons
from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent
from dplora.errors import PlanRefusedError

SIGMA_MAX = 1e4
SIGMA_MIN = 1e-3
RTOL = {Accountant.RDP: 1e-4, Accountant.PRV: 4e-3, Accountant.PLD: 4e-3}
CACHE_ENV = "DPLORA_CACHE_DIR"


def cache_dir() -> Path:
    """User cache folder of dplora: ``$DPLORA_CACHE_DIR``, else ``$XDG_CACHE_HOME/dplora``, else ``~/.cache/dplora``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dplora"


def _cache_file() -> Path:
    return cache_dir() / "calibration.json"


def _cache_key(accountant, adjacency, q, steps, delta, target) -> str:
    parts = [accountant.value, accountant_version(accountant), adjacency.value, repr(q), str(steps), repr(delta)]
    return "|".join([*parts, repr(target)])


def _cache_load() -> dict:
    try:
        data = json.loads(_cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _cache_hit(key: str, target: float) -> tuple[float, float] | None:
    """(σ, ε) cached under ``key`` if well formed and meeting ``target``; a damaged entry is ignored."""
    hit = _cache_load().get(key)
    if not isinstance(hit, dict):
        return None
    sigma, eps = hit.get("noise_multiplier"), hit.get("epsilon")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (sigma, eps)):
        return None
    if not (math.isfinite(sigma) and sigma > 0 and math.isfinite(eps) and 0 <= eps <= target):
        return None
    return float(sigma), float(eps)


def _cache_store(key: str, sigma: float, eps: float) -> None:
    _cache_put(key, {"noise_multiplier": sigma, "epsilon": eps})


def cached_epsilons(event: DpSgdEvent, delta: float, accountant: Accountant, points: list[int]) -> list[float]:
    """:func:`epsilons` for intermediate checkpoints of a plan, cached on disk (progress display and budget only).

    The final ε of a run is never read from this cache: the plan recomputes it.
    """
    accountant = Accountant(accountant)
    key = "curve|" + "|".join(
        [
            accountant.value,
            accountant_version(accountant),
            event.adjacency.value,
            repr(event.sample_rate),
            repr(event.noise_multiplier),
            repr(delta),
            ",".join(map(str, points)),
        ]
    )
    hit = _cache_load().get(key)
    if (
        isinstance(hit, list)
        and len(hit) == len(points)
        and all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in hit)
    ):
        return [float(v) for v in hit]
    values = epsilons(event, delta, accountant, points)
    if all(math.isfinite(v) for v in values):
        _cache_put(key, values)
    return values


def _cache_put(key: str, value) -> None:
    try:
        data = _cache_load()
        data[key] = value
        path = _cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calibration.")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # a cache is an optimisation only


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


def _bracket(eps_of, target, start: float, accountant: Accountant, event_desc: str) -> tuple[float, float]:
    """Find lo < hi with ε(lo) > target ≥ ε(hi), starting from a guess σ = start."""
    hi = start
    while eps_of(hi) > target:
        hi *= 2.0
        if hi > SIGMA_MAX:
            hint = " RDP with orders up to 63 cannot certify ε below about 0.1 at δ=1e-5; use accountant: pld or prv"
            raise PlanRefusedError(
                f"target ε={target} cannot be reached with accountant={accountant.value} for {event_desc} even at "
                f"σ={SIGMA_MAX:g}." + (hint if accountant is Accountant.RDP else "")
            )
    lo = hi / 1.25
    while eps_of(lo) <= target:
        hi, lo = lo, lo / 1.25
        if lo < SIGMA_MIN:
            return SIGMA_MIN, SIGMA_MIN
    return lo, hi


def calibrate(
    *, target_epsilon: float, sample_rate: float, steps: int, delta: float, accountant: Accountant, adjacency: Adjacency
) -> tuple[float, float]:
    """Smallest σ (to the accountant's rtol) with ε(σ, T) ≤ target; returns (σ, ε(σ, T)).

    Raises:
        PlanRefusedError: the target cannot be reached (e.g. ε < 0.1 with RDP).
        UnsupportedAccountingError: RDP or PRV asked for replace-one.
        AccountingNumericalError: the accountant failed numerically.
    """
    accountant, adjacency = Accountant(accountant), Adjacency(adjacency)
    if steps == 0:
        return SIGMA_MIN, 0.0
    key = _cache_key(accountant, adjacency, sample_rate, steps, delta, target_epsilon)
    hit = _cache_hit(key, target_epsilon)
    if hit is not None:
        return hit

    def eps_of(sigma: float) -> float:
        event = DpSgdEvent(sample_rate=sample_rate, noise_multiplier=sigma, steps=steps, adjacency=adjacency)
        return epsilons(event, delta, accountant, [steps])[0]

    memo: dict[float, float] = {}

    def eps_memo(sigma: float) -> float:
        if sigma not in memo:
            memo[sigma] = eps_of(sigma)
        return memo[sigma]

    desc = f"q={sample_rate:g}, T={steps}, δ={delta:g}"
    start = 1.0
    if accountant is not Accountant.RDP and adjacency is Adjacency.ADD_REMOVE:
        try:
            start, _ = calibrate(
                target_epsilon=target_epsilon,
                sample_rate=sample_rate,
                steps=steps,
                delta=delta,
                accountant=Accountant.RDP,
                adjacency=adjacency,
            )
        except PlanRefusedError:
            start = 1.0
    if (
        accountant is not Accountant.RDP
        and eps_memo(start) <= target_epsilon
        and eps_memo(0.8 * start) > target_epsilon
    ):
        lo, hi = 0.8 * start, start
    else:
        lo, hi = _bracket(eps_memo, target_epsilon, start, accountant, desc)
    if lo == hi:  # even σ = SIGMA_MIN meets the target
        sigma, eps = hi, eps_memo(hi)
    else:
        sigma, eps = _bisect(eps_memo, target_epsilon, lo, hi, RTOL[accountant])
    # Re-check with the same accountant and integer T; step σ up if a numerical wobble put ε above target.
    while eps > target_epsilon:
        sigma *= 1.0 + RTOL[accountant]
        eps = eps_of(sigma)
    _cache_store(key, sigma, eps)
    return sigma, eps
