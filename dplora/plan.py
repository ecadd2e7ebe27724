"""The training plan: N, q, T and σ from a contract, with ε precomputed for the run. Loads no model.

q = expected_batch_size / N (units per logical step over protected units; never from a loader length, cases
A7). T comes from ``training.steps`` or ceil(epochs·N / expected_batch_size) in exact rational arithmetic.
The accountant is chosen here and never changes mid-run: if PRV fails numerically, the whole plan falls back
to PLD and says so (cases A3).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from fractions import Fraction

from dplora.accounting import (
    Accountant,
    AccountingNumericalError,
    Adjacency,
    DpSgdEvent,
    accountant_version,
    epsilons,
)
from dplora.accounting.calibration import cached_epsilons, calibrate
from dplora.contract import MAX_STEPS, Contract, ProtectedUnit
from dplora.errors import BadInputError, PlanRefusedError

RDP_CURVE_MAX_POINTS = 20_000  # RDP: every step up to this T, else this many checkpoints
CURVE_POINTS_SLOW = 4  # ε checkpoints for PRV/PLD (25/50/75/100 % of T, each an accountant call); RDP: every step


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingPlan:
    """Everything the accountant needs, fixed before training starts.

    Attributes:
        num_units: N, protected units (rows, tickets or users).
        num_units_source: ``"contract"`` (declared public value) or ``"data"`` (counted; recorded as such).
        sample_rate: q = expected_batch_size / N.
        steps: T, logical steps the run will take.
        noise_multiplier: σ; noise std is σ·C per logical step.
        noise_source: ``"calibrated"`` or ``"contract"``.
        epsilon: ε after T steps under ``accountant`` (≤ target_epsilon).
        epsilon_curve: (step, ε) checkpoints, ending at (T, epsilon).
        accountant_note: why the accountant differs from the contract's, if it does.
        warnings: operator-facing warnings (δ not well below 1/N, ...).
    """

    protected_unit: ProtectedUnit
    unit_key: str | None
    adjacency: Adjacency
    num_units: int
    num_units_source: str
    expected_batch_size: int
    sample_rate: float
    steps: int
    noise_multiplier: float
    noise_source: str
    max_grad_norm: float
    delta: float
    target_epsilon: float
    accountant: Accountant
    accountant_version: str
    accountant_note: str | None
    epsilon: float
    epsilon_curve: tuple[tuple[int, float], ...]
    warnings: tuple[str, ...] = ()

    @property
    def event(self) -> DpSgdEvent:
        """The mechanism as data, stored verbatim in the release record."""
        return DpSgdEvent(
            sample_rate=self.sample_rate,
            noise_multiplier=self.noise_multiplier,
            steps=self.steps,
            adjacency=self.adjacency,
        )

    def epsilon_at(self, step: int) -> float:
        """An upper bound on ε after ``step`` logical steps (the next checkpoint at or above it).

        Raises:
            PlanRefusedError: ``step`` is beyond the planned T (the budget stop).
        """
        if step <= 0:
            return 0.0
        if step > self.steps:
            raise PlanRefusedError(f"step {step} is beyond the planned T={self.steps}: the budget is spent")
        idx = bisect.bisect_left([s for s, _ in self.epsilon_curve], step)
        return self.epsilon_curve[idx][1]

    def to_dict(self) -> dict:
        """JSON-ready plan (enums as strings)."""
        out = dataclasses.asdict(self)
        for key in ("protected_unit", "adjacency", "accountant"):
            out[key] = getattr(self, key).value
        out["epsilon_curve"] = [list(p) for p in self.epsilon_curve]
        out["warnings"] = list(self.warnings)
        out["event"] = self.event.to_dict()
        return out


def planned_steps(contract: Contract, num_units: int) -> int:
    """T: ``training.steps``, or ceil(epochs · N / expected_batch_size) computed exactly (no float truncation)."""
    training = contract.training
    if training.steps is not None:
        return int(training.steps)
    epochs = Fraction(str(training.epochs))
    return math.ceil(epochs * num_units / training.expected_batch_size)


def check_delta(delta: float, num_units: int) -> list[str]:
    """Require 0 < δ < 1/N over protected units; return warnings when δ is not well below 1/N.

    Raises:
        PlanRefusedError: δ ≥ 1/N (a mechanism that may publish one whole unit would satisfy it).
    """
    if delta * num_units >= 1:
        raise PlanRefusedError(
            f"privacy.delta={delta:g} must be below 1/N = {1 / num_units:.3g} (N={num_units} protected units)"
        )
    warnings = []
    if delta * num_units > 0.1:
        warnings.append(
            f"δ={delta:g} is above 0.1/N={0.1 / num_units:.3g}; NIST SP 800-226 discusses more conservative "
            f"choices such as 1/N²={1 / num_units**2:.3g} or 1/(N·ln N)={1 / (num_units * math.log(num_units)):.3g}"
        )
    return warnings


def _curve_steps(steps: int, accountant: Accountant) -> list[int]:
    points = CURVE_POINTS_SLOW if accountant is not Accountant.RDP else RDP_CURVE_MAX_POINTS
    if steps <= points:
        return list(range(1, steps + 1))
    return sorted({math.ceil(steps * k / points) for k in range(1, points + 1)})


def _sigma_and_curve(contract: Contract, q: float, steps: int, accountant: Accountant):
    privacy = contract.privacy
    if privacy.noise_multiplier is not None:
        sigma, source = float(privacy.noise_multiplier), "contract"
    else:
        sigma, _ = calibrate(
            target_epsilon=privacy.target_epsilon,
            sample_rate=q,
            steps=steps,
            delta=privacy.delta,
            accountant=accountant,
            adjacency=privacy.adjacency,
        )
        source = "calibrated"
    event = DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps, adjacency=privacy.adjacency)
    points = _curve_steps(steps, accountant)
    if accountant is Accountant.RDP:
        values = epsilons(event, privacy.delta, accountant, points)
    else:  # intermediate checkpoints may come from the cache; the final ε is always recomputed
        values = cached_epsilons(event, privacy.delta, accountant, points[:-1])
        values += epsilons(event, privacy.delta, accountant, points[-1:])
    return sigma, source, tuple(zip(points, values, strict=True))


def make_plan(contract: Contract, *, num_units: int, num_units_source: str) -> TrainingPlan:
    """Plan q, T and σ for ``contract`` over N = ``num_units`` protected units.

    Args:
        contract: the validated contract.
        num_units: N (units, not rows, unless the unit is a row).
        num_units_source: ``"contract"`` or ``"data"``.

    Returns:
        A frozen :class:`TrainingPlan` whose final ε ≤ target under its accountant and integer T.

    Raises:
        PlanRefusedError: q > 1, δ ≥ 1/N, unreachable target, or a given σ that spends more than the target.
        UnsupportedAccountingError: replace-one with RDP or PRV.
    """
    privacy, training = contract.privacy, contract.training
    if num_units <= 0:
        raise BadInputError("no protected units: the data is empty")
    batch = training.expected_batch_size
    if batch > num_units:
        raise PlanRefusedError(
            f"training.expected_batch_size={batch} exceeds N={num_units} protected units: q would be above 1"
        )
    q = batch / num_units
    warnings = check_delta(privacy.delta, num_units)
    steps = planned_steps(contract, num_units)
    if steps > MAX_STEPS:
        raise PlanRefusedError(f"T={steps} logical steps is above the supported {MAX_STEPS}; lower training.epochs")
    accountant, note = privacy.accountant, None
    try:
        sigma, source, curve = _sigma_and_curve(contract, q, steps, accountant)
    except AccountingNumericalError as err:
        if accountant is not Accountant.PRV:
            raise PlanRefusedError(f"accountant={accountant.value} failed numerically: {err}") from None
        accountant = Accountant.PLD
        note = f"PRV failed numerically at plan time ({err}); the whole run uses PLD instead"
        sigma, source, curve = _sigma_and_curve(contract, q, steps, accountant)
    final = curve[-1][1] if curve else 0.0
    if final > privacy.target_epsilon:
        raise PlanRefusedError(
            f"privacy.noise_multiplier={sigma:g} spends ε={final:.4f} over T={steps} steps, above "
            f"privacy.target_epsilon={privacy.target_epsilon:g}; raise σ or lower the steps"
        )
    return TrainingPlan(
        protected_unit=privacy.protected_unit,
        unit_key=privacy.unit_key,
        adjacency=privacy.adjacency,
        num_units=num_units,
        num_units_source=num_units_source,
        expected_batch_size=batch,
        sample_rate=q,
        steps=steps,
        noise_multiplier=sigma,
        noise_source=source,
        max_grad_norm=privacy.max_grad_norm,
        delta=privacy.delta,
        target_epsilon=privacy.target_epsilon,
        accountant=accountant,
        accountant_version=accountant_version(accountant),
        accountant_note=note,
        epsilon=final,
        epsilon_curve=curve,
        warnings=tuple(warnings),
    )
