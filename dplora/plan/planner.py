"""The planner: expected batch B, steps T and learning rate for a contract's ε, δ and a compute budget.

Public inputs only: the declared N (``privacy.num_units``), ε, δ, the accountant and adjacency, the compute
budget (epochs E over units, optionally a step cap) and the contract's reference learning rate. It never reads
the data file, per-unit record counts or anything else computed on private data, so the choice (and the q, T, σ
it fixes) is the same on neighbouring datasets.

The rule (docs/planner.md). At fixed ε and δ, what drives DP-SGD's utility is the effective noise σ/B of the
averaged gradient and the number of steps (Sander et al. 2023, "TAN without a burn", ICML; McKenna et al. 2025,
"Scaling laws for differentially private language models"): for each B in :data:`BATCH_GRID` with B ≤ N/4,

- T = ceil(E·N/B), capped at ``max_steps`` when given;
- σ = the calibrated σ for (q = B/N, T) under the contract's accountant (checked ε(σ, T) ≤ target);
- eligible when T ≥ :data:`MIN_STEPS` (too few steps cannot use the signal) and σ is reachable; a step cap below
  :data:`MIN_STEPS` is the user's explicit compute budget and lowers the floor to the cap (:func:`step_floor`), so
  the planner then chooses B at T = the cap (issue 42: the shipped configs' ``steps: 20``/``24`` with
  ``expected_batch_size: auto`` were refused).

The choice is the eligible candidate with the smallest σ/B; ties (relative 1e-9) go to the larger T, then the
smaller B. The learning rate scales with √(B/B_ref) from the contract's ``training.lr`` read as the rate at
B_ref = 32 (square-root scaling for Adam-type optimisers, Malladi et al. 2022, "On the SDEs and scaling rules for
adaptive gradient algorithms"). The default schedule is constant with no warmup: the rule lands near the step floor
(T of 50 to a few hundred), where a decaying schedule halves the summed learning rate; the first CPU comparison
(issue 29, cosine with 5 % warmup) lost to the demo's constant hand settings, and docs/planner.md gives the
comparison that chose it.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

from dplora.accounting.calibration import calibrate
from dplora.accounting.checked import numerical_chain
from dplora.contract.spec import MAX_STEPS
from dplora.errors import PlanRefusedError

BATCH_GRID = (32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
MIN_STEPS = 50
DEFAULT_EPOCHS = 3
MAX_BATCH_FRACTION = Fraction(1, 4)  # B ≤ N/4: q ≤ 0.25 keeps sampling amplification meaningful
REFERENCE_BATCH = 32
DEFAULT_SCHEDULE = "constant"
DEFAULT_WARMUP_STEPS = 0
TIE_RTOL = 1e-9


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
    """One (B, T) the planner weighed: q = B/N, σ calibrated for it, σ/B, lr, and why it is not eligible."""

    expected_batch_size: int
    steps: int
    sample_rate: float
    noise_multiplier: float | None
    epsilon: float | None
    noise_per_unit: float | None
    lr: float
    excluded: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recommendation:
    """The planner's choice and every candidate it weighed (all public numbers)."""

    choice: Candidate
    candidates: tuple[Candidate, ...]
    epochs: float
    max_steps: int | None
    num_units: int
    lr_schedule: str
    warmup_steps: int
    rule: str
    schedule_source: str = "planner"  # "contract": training.lr_schedule / warmup_steps set by hand and used

    def to_dict(self) -> dict:
        """JSON-ready (written into the plan and the release record)."""
        return {
            "rule": self.rule,
            "inputs": {
                "num_units": self.num_units,
                "epochs": self.epochs,
                "max_steps": self.max_steps,
                "min_steps": step_floor(self.max_steps),
                "batch_grid": list(BATCH_GRID),
                "reference_batch": REFERENCE_BATCH,
            },
            "choice": dataclasses.asdict(self.choice),
            "lr_schedule": self.lr_schedule,
            "warmup_steps": self.warmup_steps,
            "schedule_source": self.schedule_source,
            "candidates": [dataclasses.asdict(c) for c in self.candidates],
        }


RULE = (
    "B in the grid with B ≤ N/4; T = ceil(E·N/B) (capped at max_steps); σ calibrated to the target; smallest σ/B "
    "among T ≥ min(50, max_steps); ties: larger T, then smaller B; lr = lr_ref·sqrt(B/32), constant, no warmup "
    "(Sander et al. 2023; McKenna et al. 2025; Malladi et al. 2022)"
)


def step_floor(max_steps: int | None) -> int:
    """The least T a candidate may have: :data:`MIN_STEPS`, or a lower step cap (the user's compute budget).

    Returns:
        min(MIN_STEPS, max_steps), or MIN_STEPS without a cap; steps.
    """
    return MIN_STEPS if max_steps is None else min(MIN_STEPS, max_steps)


def scaled_lr(lr_ref: float, batch: int) -> float:
    """lr_ref·√(B/B_ref), B_ref = 32 (square-root scaling, Malladi et al. 2022). Units: as ``lr_ref``."""
    return lr_ref * math.sqrt(batch / REFERENCE_BATCH)


def recommend(
    *,
    num_units: int,
    target_epsilon: float,
    delta: float,
    accountant,
    adjacency,
    lr_ref: float,
    epochs: float | None = None,
    max_steps: int | None = None,
) -> Recommendation:
    """Choose B and T by the module's rule from public inputs only.

    Args:
        num_units: N, the declared public number of protected units (never a count of the data).
        target_epsilon, delta: the contract's ε and δ (natural log; δ < 1/N).
        accountant, adjacency: the contract's accountant and adjacency (σ is calibrated with them).
        lr_ref: the learning rate at B_ref = 32.
        epochs: E, passes over the N units (default 3).
        max_steps: an optional cap on T.

    Returns:
        A :class:`Recommendation`; every candidate's ε ≤ target under the same accountant and integer T.

    Raises:
        PlanRefusedError: no candidate is eligible (N too small for B ≥ 32 and T ≥ min(50, max_steps), or the
            target unreachable).
    """
    floor = step_floor(max_steps)
    e = Fraction(str(DEFAULT_EPOCHS if epochs is None else epochs))
    chain = numerical_chain(accountant, adjacency)
    cands = []
    for batch in BATCH_GRID:
        if batch > MAX_BATCH_FRACTION * num_units:
            break
        steps = math.ceil(e * num_units / batch)
        if max_steps is not None:
            steps = min(steps, max_steps)
        q = batch / num_units
        lr = scaled_lr(lr_ref, batch)
        if steps < floor or steps > MAX_STEPS:
            why = f"T={steps} below the minimum {floor}" if steps < floor else f"T above {MAX_STEPS}"
            cands.append(_cand(batch, steps, q, None, None, lr, why))
            continue
        try:
            sigma, eps = calibrate(
                target_epsilon=target_epsilon,
                sample_rate=q,
                steps=steps,
                delta=delta,
                accountant=accountant,
                adjacency=adjacency,
                chain=chain,
            )
        except (PlanRefusedError, ArithmeticError) as err:
            cands.append(_cand(batch, steps, q, None, None, lr, f"σ not calibrated: {str(err).splitlines()[0]}"))
            continue
        cands.append(_cand(batch, steps, q, sigma, eps, lr, None))
    eligible = [c for c in cands if c.excluded is None]
    if not eligible:
        raise PlanRefusedError(
            f"the planner found no batch B ≥ {BATCH_GRID[0]} with B ≤ N/4 and T ≥ {floor} for N={num_units}, "
            f"E={float(e):g}"
            + (f", max steps {max_steps}" if max_steps else "")
            + (
                f": N/4 < {BATCH_GRID[0]}, so no batch is eligible (the planner needs N ≥ {4 * BATCH_GRID[0]} "
                "units); set training.expected_batch_size and training.steps yourself"
                if num_units < 4 * BATCH_GRID[0]
                else ": raise the epochs or the step cap, or set training.expected_batch_size and steps yourself"
            )
        )
    best = min(c.noise_per_unit for c in eligible)
    tied = [c for c in eligible if c.noise_per_unit <= best * (1 + TIE_RTOL)]
    choice = min(tied, key=lambda c: (-c.steps, c.expected_batch_size))
    return Recommendation(
        choice=choice,
        candidates=tuple(cands),
        epochs=float(e),
        max_steps=max_steps,
        num_units=num_units,
        lr_schedule=DEFAULT_SCHEDULE,
        warmup_steps=DEFAULT_WARMUP_STEPS,
        rule=RULE,
    )


def _cand(batch, steps, q, sigma, eps, lr, excluded) -> Candidate:
    return Candidate(
        expected_batch_size=batch,
        steps=steps,
        sample_rate=q,
        noise_multiplier=sigma,
        epsilon=eps,
        noise_per_unit=None if sigma is None else sigma / batch,
        lr=lr,
        excluded=excluded,
    )
