"""Privacy accounting for DP-SGD: ε of a mechanism, and σ calibrated to a target ε.

Three accountants behind one interface, found by name (:mod:`~dplora.accounting.registry`; the contract's
:class:`Accountant` values are their names): Opacus PRV and RDP (add/remove only) and dp_accounting PLD
(add/remove and replace-one), in :mod:`~dplora.accounting.accountants`.
The mechanism is described as data (:class:`DpSgdEvent`).
No GDP/CLT accountant is offered: it underestimates ε at few steps (cases A5). PRV and PLD are called only
inside their range (:mod:`~dplora.accounting.cost`); plans use checked curves (:mod:`~dplora.accounting.checked`).

>>> round(epsilon(sample_rate=0.01, noise_multiplier=1.0, steps=300, delta=1e-5, accountant="rdp"), 3)
1.451
"""

from __future__ import annotations

import math

import dplora.accounting.accountants  # noqa: F401 - registers the built-in accountants (RDP, PRV, PLD)
from dplora.accounting import registry
from dplora.accounting.backends import AccountingNumericalError, epsilons, require_supported
from dplora.accounting.calibration import calibrate
from dplora.accounting.cost import Tolerance, out_of_range
from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent
from dplora.errors import BadInputError

__all__ = ["calibrate_noise", "epsilon", "validate_delta"]


def validate_delta(delta: float) -> None:
    """Raise BadInputError unless 0 < δ < 1 (δ ≥ 1 gives negative ε, δ = 0 gives ∞; cases A6)."""
    if not (isinstance(delta, (int, float)) and math.isfinite(delta) and 0.0 < delta < 1.0):
        raise BadInputError(f"Expected 0 < delta < 1, got delta={delta!r}")


def _accountant(accountant) -> Accountant | str:
    return registry.key(accountant)  # BadInputError naming the offered accountants for an unknown name


def _adjacency(adjacency) -> Adjacency:
    try:
        return Adjacency(adjacency)
    except ValueError:
        offered = ", ".join(repr(a.value) for a in Adjacency)
        raise BadInputError(f"adjacency={adjacency!r} is not one of {offered}") from None


def _event(sample_rate, noise_multiplier, steps, adjacency) -> DpSgdEvent:
    try:
        return DpSgdEvent(
            sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps, adjacency=_adjacency(adjacency)
        )
    except ValueError as err:
        raise BadInputError(str(err)) from err


def epsilon(
    *,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    delta: float,
    accountant: Accountant | str = "prv",
    adjacency: Adjacency | str = "add_remove",
) -> float:
    """ε spent by T steps of Poisson-subsampled DP-SGD (Abadi et al. 2016) at (q, σ), for a given δ.

    Args:
        sample_rate: q ∈ (0, 1], the per-step inclusion probability of one protected unit.
        noise_multiplier: σ ≥ 0 (noise std σ·C); σ = 0 gives ε = ∞.
        steps: T ≥ 0 logical steps (integer); T = 0 gives ε = 0.
        delta: δ ∈ (0, 1).
        accountant: ``"prv"`` (Opacus), ``"rdp"`` (Opacus) or ``"pld"`` (dp_accounting).
        adjacency: ``"add_remove"`` or ``"replace_one"`` (PLD only).

    Returns:
        ε ≥ 0 (unitless, natural log): the named accountant's own number at its default precision (PRV
        eps_error 0.01, PLD interval 1e-4), not floored by RDP; plans use checked curves instead.

    Raises:
        BadInputError: q, σ, T or δ out of range, or an accountant dplora does not offer (e.g. ``"gdp"``).
        UnsupportedAccountingError: replace-one with RDP or PRV.
        AccountingNumericalError: the accountant is outside its range (cost above the limit, δ too small) or
            failed numerically (PRV on short, loose runs); the message says which.
    """
    validate_delta(delta)
    acc = _accountant(accountant)
    event = _event(sample_rate, noise_multiplier, steps, adjacency)
    require_supported(acc, event.adjacency)
    if event.noise_multiplier > 0:
        reason = out_of_range(acc, event, delta, Tolerance())
        if reason is not None:
            fix = "use accountant='rdp'" if event.adjacency is Adjacency.ADD_REMOVE else "change q, σ, T or δ"
            raise AccountingNumericalError(f"{registry.get(acc).name} is not called here: {reason}; {fix}")
    return epsilons(event, delta, acc, [steps])[0]


def calibrate_noise(
    *,
    target_epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: Accountant | str = "prv",
    adjacency: Adjacency | str = "add_remove",
) -> float:
    """Smallest noise multiplier σ (within 0.4%) whose ε(σ, T) ≤ target_epsilon under ``accountant``.

    The returned σ was checked with the same accountant and the same integer T (cases A1).

    Args:
        target_epsilon: ε target > 0.
        sample_rate: q ∈ (0, 1].
        steps: T ≥ 0 logical steps.
        delta: δ ∈ (0, 1).
        accountant: ``"prv"``, ``"rdp"`` or ``"pld"``.
        adjacency: ``"add_remove"`` or ``"replace_one"`` (PLD only).

    Returns:
        σ > 0, calibrated on checked ε (RDP-floored under add/remove; PRV → PLD → RDP where one is out of
        range; see :mod:`dplora.accounting.checked`).

    Raises:
        BadInputError: an argument out of range, or an accountant dplora does not offer (e.g. ``"gdp"``).
        PlanRefusedError: the target cannot be reached (RDP cannot certify ε below about 0.1 at δ = 1e-5).
        UnsupportedAccountingError: replace-one with RDP or PRV.
        AccountingNumericalError: the accountant failed numerically.
    """
    validate_delta(delta)
    if not (isinstance(target_epsilon, (int, float)) and math.isfinite(target_epsilon) and target_epsilon > 0):
        raise BadInputError(f"Expected a finite target_epsilon > 0, got target_epsilon={target_epsilon!r}")
    event = _event(sample_rate, 1.0, steps, adjacency)
    sigma, _ = calibrate(
        target_epsilon=float(target_epsilon),
        sample_rate=float(sample_rate),
        steps=int(steps),
        delta=float(delta),
        accountant=_accountant(accountant),
        adjacency=event.adjacency,
    )
    return sigma
