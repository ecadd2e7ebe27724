"""Checked ε curves: an accountant's numbers are used only where they hold.

A numerical accountant (PRV, PLD) is asked only inside its range (:mod:`dplora.accounting.cost`), and its
answer is used only if it passes the checks: every value finite, and non-decreasing in T (a decrease larger
than the tolerance's slack means the accountant is outside its working range). Values within the slack are
made monotone by a suffix minimum, which keeps each an upper bound: the true ε is non-decreasing in T (the
first t steps are a post-processing of the first T), so ε(t) ≤ ε(T) ≤ bound(T) for t ≤ T.

Under add/remove the analytic RDP bound (Mironov et al. 2019; Balle et al. 2020, Thm. 21) is a valid upper bound
for the same event at every step, so each point is min(accountant, RDP): the minimum of two valid bounds is a
valid bound. When the accountants in the chain are all out of range or fail a check, the curve is RDP's.
Under replace-one only PLD applies (Opacus's RDP and PRV are add/remove only; dp_accounting's RDP refuses
replace-one for Poisson events): outside its checked range the plan is refused with the setting to change.

The chain for add/remove is PRV → PLD → RDP (PRV failing falls to PLD only where PLD passes the checks), PLD →
RDP, or RDP alone; for replace-one it is PLD alone.

Every value of a curve is computed, never read from the on-disk cache: the curve is what the plan states (ε at
each step, the ε charged for a stopped run), and a cache file is writable by whoever shares the folder, so a
value edited down would pass every check above (zeros are finite and non-decreasing).
"""

from __future__ import annotations

import dataclasses
import math

from dplora.accounting import registry
from dplora.accounting.backends import (
    AccountingNumericalError,
    epsilons,
    rdp_epsilons,
    require_supported,
)
from dplora.accounting.cost import Tolerance, out_of_range
from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent
from dplora.errors import PlanRefusedError

FLOOR = Accountant.RDP  # the analytic bound every add/remove curve is floored by, and the chain's fallback
SIGMA_PROBE = 1.01  # the σ-monotonicity probe of a given σ: ε(1.01·σ) must not exceed ε(σ) beyond the slack


class OutOfRangeError(PlanRefusedError):
    """Replace-one with PLD outside its checked range: no accountant can give a trusted ε (exit code 2)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckedCurve:
    """ε after each step count, every value checked.

    Attributes:
        accountant: whose numbers these are (RDP when no numerical accountant in the chain could be used): an
            :class:`Accountant` member for a built-in, else the registered name.
        steps: step counts, increasing.
        epsilons: ε at each step count: finite unless even RDP is unbounded, non-decreasing, and under
            add/remove never above RDP.
        notes: why an accountant of the chain was skipped, and where RDP was lower.
    """

    accountant: Accountant
    steps: tuple[int, ...]
    epsilons: tuple[float, ...]
    notes: tuple[str, ...] = ()


def numerical_chain(accountant: Accountant | str, adjacency: Adjacency | str) -> tuple[Accountant | str, ...]:
    """The numerical accountants tried in order for ``accountant`` (RDP follows under add/remove).

    The accountant's object says (:meth:`~dplora.accounting.registry.PrivacyAccountant.numerical_chain`): PRV →
    PLD for PRV, PLD for PLD, nothing (RDP alone) for RDP. Built-ins are :class:`Accountant` members.

    Raises:
        BadInputError: no accountant of that name is registered.
        UnsupportedAccountingError: the accountant does not support ``adjacency`` (RDP or PRV asked for
            replace-one).
    """
    return tuple(registry.key(name) for name in registry.make(accountant, adjacency).numerical_chain())


def curve_problem(steps: list[int], values: list[float], slack: float) -> str | None:
    """Why a curve fails the checks (None when it passes): a non-finite value, or a decrease beyond ``slack``."""
    for t, v in zip(steps, values, strict=True):
        if not math.isfinite(v):
            return f"ε={v} at step {t}"
    for i in range(1, len(values)):
        if values[i] < values[i - 1] - slack:
            return (
                f"ε falls from {values[i - 1]:.4g} at step {steps[i - 1]} to {values[i]:.4g} at step {steps[i]} "
                "(not non-decreasing in T)"
            )
    return None


def sigma_problem(pairs: list[tuple[float, float]], slack: float) -> str | None:
    """Why (σ, ε) pairs are not non-increasing in σ beyond ``slack`` (None when they are)."""
    ordered = sorted(pairs)
    for (s1, e1), (s2, e2) in zip(ordered, ordered[1:], strict=False):
        if math.isfinite(e1) and e2 > e1 + slack:
            return f"ε rises from {e1:.4g} at σ={s1:.4g} to {e2:.4g} at σ={s2:.4g} (not non-increasing in σ)"
    return None


def _suffix_min(values: list[float]) -> list[float]:
    out, low = [], math.inf
    for v in reversed(values):
        low = min(low, v)
        out.append(low)
    return out[::-1]


def _try(accountant, event, delta, steps, tolerance, probe_sigma):
    """(values, None) when ``accountant`` is in range and passes the checks, else (None, why)."""
    reason = out_of_range(accountant, dataclasses.replace(event, steps=max(steps)), delta, tolerance)
    if reason is not None:
        return None, reason
    try:
        values = epsilons(event, delta, accountant, steps, tolerance)
        reason = curve_problem(steps, values, tolerance.slack)
        if reason is None and probe_sigma:
            top = dataclasses.replace(event, noise_multiplier=event.noise_multiplier * SIGMA_PROBE)
            pairs = [(event.noise_multiplier, values[-1])]
            pairs.append((top.noise_multiplier, epsilons(top, delta, accountant, [max(steps)], tolerance)[0]))
            reason = sigma_problem(pairs, tolerance.slack)
    except AccountingNumericalError as err:
        return None, str(err)
    return (None, reason) if reason else (values, None)


def checked_curve(
    event: DpSgdEvent,
    delta: float,
    chain: tuple[Accountant, ...],
    steps: list[int],
    tolerance: Tolerance,
    *,
    probe_sigma: bool = False,
) -> CheckedCurve:
    """ε of ``event``'s q, σ and adjacency after each of ``steps``, from the first accountant of ``chain`` that
    is in range and passes the checks; under add/remove floored by RDP (see the module docstring).

    Args:
        event: the mechanism (its ``steps`` is ignored; ``steps`` gives the counts).
        delta: δ ∈ (0, 1).
        chain: numerical accountants to try in order (:func:`numerical_chain`); empty means RDP.
        steps: increasing step counts ≥ 0.
        tolerance: PRV eps_error, PLD interval and the check slack.
        probe_sigma: also check that ε at the last step does not rise when σ grows by 1 %.

    Returns:
        A :class:`CheckedCurve`.

    Raises:
        OutOfRangeError: replace-one and PLD out of range or failing a check (the message names the setting).
        UnsupportedAccountingError: replace-one with an empty chain.
    """
    steps = list(steps)
    floor = rdp_epsilons(event, delta, steps) if event.adjacency is Adjacency.ADD_REMOVE else None
    notes = []
    for accountant in chain:
        values, reason = _try(accountant, event, delta, steps, tolerance, probe_sigma)
        if values is None:
            notes.append(f"{registry.get(accountant).name.upper()} not used: {reason}")
            continue
        values = _suffix_min(values)
        if floor is not None:
            lower = sum(r < v for r, v in zip(floor, values, strict=True))
            values = [min(r, v) for r, v in zip(floor, values, strict=True)]
            if lower:
                notes.append(f"RDP (a valid bound under add/remove) was lower at {lower} of {len(steps)} points")
        return CheckedCurve(accountant=accountant, steps=tuple(steps), epsilons=tuple(values), notes=tuple(notes))
    if floor is None:
        require_supported(chain[0] if chain else FLOOR, event.adjacency)
        hint = (
            "raise privacy.delta"
            if "δ=" in notes[-1] or "inf" in notes[-1]
            else "lower training.steps (or epochs), or set privacy.target_epsilon nearer 1-10"
        )
        raise OutOfRangeError(
            f"adjacency=replace_one needs PLD, and PLD is outside its checked range here ({notes[-1]}); {hint}"
        )
    return CheckedCurve(accountant=FLOOR, steps=tuple(steps), epsilons=tuple(floor), notes=tuple(notes))
