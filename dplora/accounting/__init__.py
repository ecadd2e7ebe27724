"""Privacy accounting for DP-SGD: ε of a mechanism, and σ calibrated to a target ε.

Three accountants behind one interface (:class:`Accountant`): Opacus PRV and RDP (add/remove only) and
dp_accounting PLD (add/remove and replace-one). The mechanism is described as data (:class:`DpSgdEvent`).
No GDP/CLT accountant is offered: it underestimates ε at few steps (cases A5).

>>> round(epsilon(sample_rate=0.01, noise_multiplier=1.0, steps=300, delta=1e-5, accountant="rdp"), 3)
1.451
"""

from __future__ import annotations

import math

from dplora.accounting.backends import (
    RDP_ORDERS,
    AccountingNumericalError,
    accountant_version,
    epsilons,
)
from dplora.accounting.calibration import calibrate
from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent, Sampler, sensitivity
from dplora.errors import BadInputError

__all__ = [
    "RDP_ORDERS",
    "Accountant",
    "AccountingNumericalError",
    "Adjacency",
    "DpSgdEvent",
    "Sampler",
    "accountant_version",
    "calibrate_noise",
    "epsilon",
    "epsilons",
    "sensitivity",
    "validate_delta",
]


def validate_delta(delta: float) -> None:
    """Raise BadInputError unless 0 < δ < 1 (δ ≥ 1 gives negative ε, δ = 0 gives ∞; cases A6)."""
    if not (isinstance(delta, (int, float)) and math.isfinite(delta) and 0.0 < delta < 1.0):
        raise BadInputError(f"Expected 0 < delta < 1, got delta={delta!r}")


def _event(sample_rate, noise_multiplier, steps, adjacency) -> DpSgdEvent:
    try:
        return DpSgdEvent(
            sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=steps, adjacency=Adjacency(adjacency)
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
        ε ≥ 0 (unitless, natural log).

    Raises:
        BadInputError: q, σ, T or δ out of range.
        UnsupportedAccountingError: replace-one with RDP or PRV.
        AccountingNumericalError: the accountant failed numerically (PRV on short, loose runs).
    """
    validate_delta(delta)
    event = _event(sample_rate, noise_multiplier, steps, adjacency)
    return epsilons(event, delta, Accountant(accountant), [steps])[0]


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
        σ > 0.

    Raises:
        BadInputError: an argument out of range.
        PlanRefusedError: the target cannot be reached (RDP cannot certify ε below about 0.1 at δ = 1e-5).
        UnsupportedAccountingError: replace-one with RDP or PRV.
        AccountingNumericalError: the accountant failed numerically.
    """
    validate_delta(delta)
    if not (isinstance(target_epsilon, (int, float)) and math.isfinite(target_epsilon) and target_epsilon > 0):
        raise BadInputError(f"Expected a finite target_epsilon > 0, got target_epsilon={target_epsilon!r}")
    _event(sample_rate, 1.0, steps, adjacency)
    sigma, _ = calibrate(
        target_epsilon=float(target_epsilon),
        sample_rate=float(sample_rate),
        steps=int(steps),
        delta=float(delta),
        accountant=Accountant(accountant),
        adjacency=Adjacency(adjacency),
    )
    return sigma
