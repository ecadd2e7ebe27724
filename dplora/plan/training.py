"""The training plan: N, q, T and σ from a contract, with ε precomputed for the run. Loads no model.

q = expected_batch_size / N (units per logical step over protected units; never from a loader length, cases
A7). T comes from ``training.steps`` or ceil(epochs·N / expected_batch_size) in exact rational arithmetic.
The accountant is chosen here and never changes mid-run. Every ε the plan holds is checked
(:mod:`dplora.accounting.checked`): PRV and PLD are called only inside their cost and δ range, their answers must
be finite, non-decreasing in T and non-increasing in σ, and under add/remove each value is floored by RDP. When
the contract's accountant cannot be used, the plan says which one it used and why (``accountant_note``, also in
the release record): add/remove falls PRV → PLD → RDP; replace-one has only PLD and is refused outside its range.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from fractions import Fraction

from dplora.accounting.backends import AccountingNumericalError, accountant_version, rdp_epsilons
from dplora.accounting.calibration import calibrate
from dplora.accounting.checked import CheckedCurve, checked_curve, numerical_chain
from dplora.accounting.cost import tolerance_for
from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent
from dplora.contract.choices import ProtectedUnit
from dplora.contract.spec import MAX_STEPS, Contract
from dplora.errors import BadInputError, PlanRefusedError

CURVE_MAX_POINTS = 20_000  # the per-step curve: every step up to this T, else this many evenly spaced steps
CURVE_POINTS_SLOW = 8  # PRV/PLD checkpoints: step 1, powers of 2, and T·k/8 (each an accountant call)
# Small populations (see docs/sharp_edges.md): below this N, or above this q, budget and train warn.
SMALL_POPULATION_UNITS = 200
HIGH_SAMPLE_RATE = 0.1


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
        clipping: ``clip`` or ``normalize`` (what each unit's summed vector gets; sensitivity C either way).
        lr, lr_schedule, warmup_steps, weight_decay: the optimiser's data-independent settings (no privacy effect).
        planner: the planner's choice and the candidates it weighed (``training.expected_batch_size: auto``).
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
    clipping: str = "clip"
    lr: float | None = None
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    planner: dict | None = None

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
        """Checked upper bound on ε after ``step`` logical steps: the curve's value at the first point ≥ step.

        The curve has every step up to T = 20,000 (else 20,000 evenly spaced steps), so this is ε at ``step``
        itself there; it is ≤ target for every step ≤ T. The training loop reads it before every step.

        Raises:
            PlanRefusedError: ``step`` is beyond the planned T (the budget stop).
        """
        if step <= 0:
            return 0.0
        if step > self.steps:
            raise PlanRefusedError(f"step {step} is beyond the planned T={self.steps}: the budget is spent")
        idx = bisect.bisect_left([s for s, _ in self.epsilon_curve], step)
        return self.epsilon_curve[idx][1]

    def epsilon_spent(self, steps_done: int) -> float:
        """ε charged for a run that stopped after ``steps_done`` accounted steps: 0.0 at 0, finite, ≤ target.

        Raises:
            PlanRefusedError: ``steps_done`` is beyond the planned T.
        """
        return self.epsilon_at(steps_done) if steps_done > 0 else 0.0

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


def small_population_warning(num_units: int, sample_rate: float) -> str | None:
    """One line on what ε means for a small population (N < 200 units) or a large q (> 0.1); else None.

    ε bounds what one unit changes. With a handful of units, anything shared by k of them is a large part of the
    data and is covered only at k·ε (group privacy, Dwork & Roth 2014, Thm. 2.2); with q > 0.1 amplification
    by Poisson sampling is weak (the moments-accountant bound of Abadi et al. 2016, Thm. 1, assumes
    q < 1/(16σ)), so ε grows nearly as for full-batch training.
    """
    parts = []
    if num_units < SMALL_POPULATION_UNITS:
        parts.append(
            f"N={num_units} protected units is a small population: ε bounds what one unit changes, but anything "
            f"shared by k units is covered only at k·ε"
        )
    if sample_rate > HIGH_SAMPLE_RATE:
        parts.append(f"q={sample_rate:.3g} is above {HIGH_SAMPLE_RATE}: sampling amplifies privacy little here")
    return "; ".join(parts) + " (see docs/sharp_edges.md)" if parts else None


def curve_grid(steps: int) -> list[int]:
    """Steps at which the plan holds ε: every step up to 20,000, else step 1 and 20,000 evenly spaced steps."""
    if steps <= CURVE_MAX_POINTS:
        return list(range(1, steps + 1))
    return sorted({1} | {math.ceil(steps * k / CURVE_MAX_POINTS) for k in range(1, CURVE_MAX_POINTS + 1)})


def checkpoint_steps(steps: int) -> list[int]:
    """Where PRV/PLD are asked: every step up to 8, else step 1, powers of 2 below T, and ceil(T·k/8).

    Dense early, where ε rises fastest; between checkpoints the plan takes the next checkpoint's value, floored
    by RDP at every step under add/remove (:func:`_per_step`).
    """
    if steps <= CURVE_POINTS_SLOW:
        return list(range(1, steps + 1))
    powers = {2**k for k in range(steps.bit_length()) if 2**k < steps}
    return sorted(powers | {math.ceil(steps * k / CURVE_POINTS_SLOW) for k in range(1, CURVE_POINTS_SLOW + 1)})


def _per_step(curve: CheckedCurve, event: DpSgdEvent, delta: float) -> tuple[tuple[int, float], ...]:
    """Spread checkpoint values over the grid: each step takes the next checkpoint's ε, floored by RDP there."""
    grid = sorted(set(curve_grid(event.steps)) | set(curve.steps))
    floor = rdp_epsilons(event, delta, grid) if event.adjacency is Adjacency.ADD_REMOVE else [math.inf] * len(grid)
    values = [curve.epsilons[bisect.bisect_left(curve.steps, t)] for t in grid]
    return tuple((t, min(v, r)) for t, v, r in zip(grid, values, floor, strict=True))


def _sigma(privacy, q: float, steps: int, chain, notes: list[str] | None = None) -> tuple[float, str]:
    if privacy.noise_multiplier is not None:
        return float(privacy.noise_multiplier), "contract"
    sigma, _ = calibrate(
        notes=notes,
        target_epsilon=privacy.target_epsilon,
        sample_rate=q,
        steps=steps,
        delta=privacy.delta,
        accountant=privacy.accountant,
        adjacency=privacy.adjacency,
        chain=chain,
    )
    return sigma, "calibrated"


def _account(contract: Contract, q: float, steps: int):
    """σ, its source, the checked checkpoint curve and the notes; falls along the chain until checks pass."""
    privacy = contract.privacy
    tolerance = tolerance_for(privacy.target_epsilon)
    chain = numerical_chain(privacy.accountant, privacy.adjacency)
    notes: list[str] = []
    for _ in range(4):  # each pass drops at least one accountant from the chain
        try:
            sigma, source = _sigma(privacy, q, steps, chain, notes)
        except AccountingNumericalError as err:
            if privacy.adjacency is Adjacency.REPLACE_ONE or not chain:
                name = chain[0].value if chain else "rdp"
                raise PlanRefusedError(f"accountant={name} failed a check: {err}") from None
            notes.append(f"{'/'.join(a.value.upper() for a in chain)} not used: {err}")
            chain = ()
            continue
        event = DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps, adjacency=privacy.adjacency)
        points = checkpoint_steps(steps) if chain else curve_grid(steps)
        probe = bool(chain) and source == "contract"  # a calibrated σ was checked against its neighbours
        curve = checked_curve(event, privacy.delta, chain, points, tolerance, probe_sigma=probe)
        met = source == "contract" or curve.epsilons[-1] <= privacy.target_epsilon
        if met or not chain or curve.accountant is chain[0]:
            return sigma, source, event, curve, notes
        # The full curve failed a check that calibration (ε at T only) could not see: recalibrate without the
        # accountants it skipped.
        notes.extend(curve.notes)
        chain = chain[chain.index(curve.accountant) :] if curve.accountant in chain else ()
    raise AssertionError("accounting did not settle")  # pragma: no cover


def _note(contract: Contract, used: Accountant, notes: list[str]) -> str | None:
    if not notes and used is contract.privacy.accountant:
        return None
    head = f"contract accountant {contract.privacy.accountant.value.upper()}; ε from {used.value.upper()}"
    return "; ".join([head, *dict.fromkeys(notes)])


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
    if training.is_auto or training.steps == "auto":
        raise BadInputError("training.expected_batch_size: auto is resolved by the planner before planning")
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
    sigma, source, event, curve, notes = _account(contract, q, steps)  # T ≥ 1 (the contract checks it)
    epsilon_curve = _per_step(curve, event, privacy.delta)
    final = epsilon_curve[-1][1]
    if not final <= privacy.target_epsilon:  # also refuses ε = ∞ or NaN
        raise PlanRefusedError(
            f"privacy.noise_multiplier={sigma:g} spends ε={final:.4f} over T={steps} steps, above "
            f"privacy.target_epsilon={privacy.target_epsilon:g}; raise σ or lower the steps"
        )
    small = small_population_warning(num_units, q)
    if small:
        warnings.append(small)
    held = contract.data.eval_fraction
    if held is not None and held >= 0.5:  # from the contract alone: public
        warnings.append(
            f"data.eval_fraction={held:g} holds out about {held:.1%} of the protected units for evaluation: "
            f"training sees about {1 - held:.1%} of them (is a small fraction such as 0.1 meant?)"
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
        accountant=curve.accountant,
        accountant_version=accountant_version(curve.accountant),
        accountant_note=_note(contract, curve.accountant, [*notes, *curve.notes]),
        epsilon=final,
        epsilon_curve=epsilon_curve,
        warnings=tuple(warnings),
        clipping=privacy.clipping.value,
        lr=training.lr,
        lr_schedule=(training.lr_schedule.value if training.lr_schedule else "constant"),
        warmup_steps=training.warmup_steps or 0,
        weight_decay=training.weight_decay,
    )


def ledger_event(plan: TrainingPlan) -> dict:
    """The plan's DP-SGD event for a ledger charge: the record's serialised form (:meth:`DpSgdEvent.to_dict`: q per
    unit, σ, planned T, adjacency, sampler) and the accountant.

    The ledger composes stored events (dplora.accounting.composition.compose_events) instead of only summing ε;
    :meth:`DpSgdEvent.from_dict` reads them back.
    """
    return {**plan.event.to_dict(), "accountant": plan.accountant.value}


def control_plan(plan: TrainingPlan) -> TrainingPlan:
    """The DP twin's plan with privacy switched off: same N, q, T and normaliser; σ = 0 and ε = ∞ at every step.

    The loop's budget check (ε after the step ≤ target) then passes trivially, and every ε the run reports,
    the ledger charge included, is ∞.
    """
    return dataclasses.replace(
        plan,
        noise_multiplier=0.0,
        noise_source="none (non-private control)",
        target_epsilon=math.inf,
        epsilon=math.inf,
        epsilon_curve=((plan.steps, math.inf),),
        accountant_note="non-private control: no accountant, ε = ∞",
    )


def measurement_twin(privacy, num_units: int) -> TrainingPlan:
    """A σ = 0 plan for measuring clipped per-unit gradients on PUBLIC data (``dplora clip-guide``, benchmarks):
    q = 1 (every unit), one step, expected batch 1, the contract's C, no noise and ε = ∞. It is never a DP plan:
    :func:`dplora.mechanism.core.make_mechanism` refuses to make a private mechanism from it, so it cannot reach
    private data through the training path.

    Args:
        privacy: the contract's privacy section (unit, adjacency, C, δ, accountant).
        num_units: units measured (public).
    Returns:
        :class:`TrainingPlan` with ``noise_multiplier`` 0 and ``epsilon`` ∞.
    """
    return TrainingPlan(
        protected_unit=privacy.protected_unit,
        unit_key=privacy.unit_key,
        adjacency=privacy.adjacency,
        num_units=num_units,
        num_units_source="public sample",
        expected_batch_size=1,
        sample_rate=1.0,
        steps=1,
        noise_multiplier=0.0,
        noise_source="none (a measurement on public data)",
        max_grad_norm=privacy.max_grad_norm,
        delta=privacy.delta,
        target_epsilon=math.inf,
        accountant=privacy.accountant,
        accountant_version="",
        accountant_note="a measurement on public data: no accountant, ε = ∞",
        epsilon=math.inf,
        epsilon_curve=((1, math.inf),),
    )
