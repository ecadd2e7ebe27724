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
  the planner then chooses B at T = the cap (otherwise the shipped configs' ``steps: 20``/``24`` with
  ``expected_batch_size: auto`` were refused).

The choice is the eligible candidate with the smallest σ/B; ties (relative 1e-9) go to the larger T, then the
smaller B. σ is calibrated only on the front of larger q and fewer T: a candidate with T at least another's and q at
most its cannot have a smaller σ/B (σ grows with T at a fixed q; σ/q does not grow with q at a fixed T). The
learning rate scales with √(B/B_ref) from the contract's ``training.lr`` read as the rate at
B_ref = 32 (square-root scaling for Adam-type optimisers, Malladi et al. 2022, "On the SDEs and scaling rules for
adaptive gradient algorithms"). The default schedule is constant with no warmup: the rule lands near the step floor
(T of 50 to a few hundred), where a decaying schedule halves the summed learning rate; the first CPU comparison
(cosine with 5 % warmup) lost to the demo's constant hand settings, and docs/planner.md gives the
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

# Logical batch sizes weighed (units per step), up to the large batches of DP pre-training and fine-tuning at scale
# (De et al. 2022 use 4,096; McKenna et al. 2025 up to millions of tokens): B = N itself (q = 1) is added when N
# is at most the grid's top, so full-batch DP-GD (Panda et al. 2024) is a candidate for small populations.
BATCH_GRID = (32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
# E weighed under ``training.epochs: auto`` (up to the declared ``training.max_epochs``, which is added itself).
EPOCH_GRID = (1, 2, 3, 5, 10, 20, 50, 100, 200)
MIN_STEPS = 50
DEFAULT_EPOCHS = 3
REFERENCE_BATCH = 32
# ``training.lr: auto``: the reference rate at B = 32 by the declared ``data.task`` (a public constant of the
# contract), fixed offline from the utility study's validation rows (docs/planner.md, docs/utility.md): 0.006 for
# generated replies (Bitext N 1,600, E 3: 80.6-81.5 % of the control's gain at ε 8 over two draws, 73.5 % at ε 3,
# against 69.4 % and 40.9 % at 0.002) and 0.002 for labels scored by likelihood (Banking77 N 554: validation
# 0.70-0.78 at ε 8 against 0.68-0.73 at 0.006, and 0.76 against 0.61-0.72 at ε 3).
TASK_REFERENCE_LR = {"generation": 6e-3, "classification": 2e-3}
DEFAULT_SCHEDULE = "constant"
DEFAULT_WARMUP_STEPS = 0
TIE_RTOL = 1e-9
# A weighed candidate rules out the ones it dominates only when its calibration closed on the target: ε at least
# this share of it. The bisection stops at σ within rtol (4e-3) of the root, which leaves ε within about 1 % of the
# target where the checked ε is smooth in σ; an ε further below closed on a jump in the checked ε (an accountant's
# range limit: PRV's grid at δ 1e-13 and T 59,500 hands over to PLD, whose ε is higher), where σ/B says nothing
# about the candidates it dominates.
TIGHT_SHARE = 0.95


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
    """One (B, E, T) the planner weighed: q = B/N, σ calibrated for it, σ/B, lr, and why it is not eligible."""

    expected_batch_size: int
    steps: int
    sample_rate: float
    noise_multiplier: float | None
    epsilon: float | None
    noise_per_unit: float | None
    lr: float
    excluded: str | None = None
    epochs: float | None = None


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
    max_epochs: float | None = None  # the declared cap of ``training.epochs: auto`` (None: E was declared)
    min_steps: int = MIN_STEPS  # the step floor the candidates were held to (:func:`step_floor`)
    lr_ref: float | None = None  # the reference rate at B = 32 the candidates' lr were scaled from
    lr_ref_source: str = "training.lr"  # or "data.task=<task>" (training.lr: auto, :data:`TASK_REFERENCE_LR`)

    def to_dict(self) -> dict:
        """JSON-ready (written into the plan and the release record)."""
        return {
            "rule": self.rule,
            "inputs": {
                "num_units": self.num_units,
                "epochs": self.epochs,
                "max_steps": self.max_steps,
                "min_steps": self.min_steps,
                "batch_grid": list(BATCH_GRID),
                "reference_batch": REFERENCE_BATCH,
                "lr_ref": self.lr_ref,
                "lr_ref_source": self.lr_ref_source,
                **({"max_epochs": self.max_epochs, "epoch_grid": list(EPOCH_GRID)} if self.max_epochs else {}),
            },
            "choice": dataclasses.asdict(self.choice),
            "lr_schedule": self.lr_schedule,
            "warmup_steps": self.warmup_steps,
            "schedule_source": self.schedule_source,
            "candidates": [dataclasses.asdict(c) for c in self.candidates],
        }


RULE = (
    "B in the grid (32 to 8192) with B < N, and B = N (q = 1) when N ≤ 8192; E declared, or with epochs: auto "
    "each E of the grid up to max_epochs; T = ceil(E·N/B) (capped at max_steps); σ calibrated to the target; "
    "smallest σ/B among T ≥ min(50, max_steps, the largest T any candidate reaches); σ is calibrated only for "
    "candidates that no other weighed one (ε within 5 % of the target) has both a q at least theirs and a T at "
    "most theirs; ties: larger T, then smaller B, then smaller E; lr = lr_ref·sqrt(B/32) (lr_ref: training.lr, or "
    "under lr: auto 0.006 for data.task generation and 0.002 for classification), constant, no warmup (Sander et "
    "al. 2023; McKenna et al. 2025; Malladi et al. 2022)"
)


def step_floor(max_steps: int | None, reachable: int | None = None) -> int:
    """The least T a candidate may have: :data:`MIN_STEPS`, lowered to a step cap (the user's compute budget) and
    to ``reachable``, the largest T any candidate reaches (a small population at a small E: the planner then takes
    the most steps it can instead of refusing).

    Returns:
        min(MIN_STEPS, max_steps, reachable) over those given; steps.
    """
    return min([MIN_STEPS, *(v for v in (max_steps, reachable) if v is not None)])


def reference_lr(task: str) -> float:
    """The reference rate at B = 32 for ``training.lr: auto``: :data:`TASK_REFERENCE_LR` of the declared
    ``data.task`` (a public contract constant; nothing computed on data). Units: learning rate.

    Raises:
        KeyError: a task with no rate in the table (the contract allows only the two).

    Source: this project's utility study (docs/planner.md, "The reference learning rate").
    """
    return TASK_REFERENCE_LR[task]


def scaled_lr(lr_ref: float, batch: int) -> float:
    """lr_ref·√(B/B_ref), B_ref = 32 (square-root scaling, Malladi et al. 2022). Units: as ``lr_ref``."""
    return lr_ref * math.sqrt(batch / REFERENCE_BATCH)


def batch_options(num_units: int) -> list[int]:
    """The logical batch sizes weighed for N units: every grid B < N, and N itself (q = 1) when N ≤ the grid's top.

    Returns:
        Increasing batch sizes (units per step), each ≤ N; empty only when N < 1.
    """
    out = [b for b in BATCH_GRID if b < num_units]
    if 1 <= num_units <= BATCH_GRID[-1]:
        out.append(num_units)
    return out


def epoch_options(epochs: float | None, max_epochs: float | None) -> list[Fraction]:
    """E weighed: the declared ``epochs`` (default 3), or with ``epochs`` None and a cap, every grid E below the cap
    and the cap itself (exact fractions: T = ceil(E·N/B) is computed without float truncation)."""
    if epochs is not None or max_epochs is None:
        return [Fraction(str(DEFAULT_EPOCHS if epochs is None else epochs))]
    cap = Fraction(str(max_epochs))
    return sorted({Fraction(e) for e in EPOCH_GRID if e < cap} | {cap})


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
    max_epochs: float | None = None,
    lr_ref_source: str = "training.lr",
) -> Recommendation:
    """Choose B, E and T by the module's rule from public inputs only.

    Args:
        num_units: N, the declared public number of protected units (never a count of the data).
        target_epsilon, delta: the contract's ε and δ (natural log; δ < 1/N).
        accountant, adjacency: the contract's accountant and adjacency (σ is calibrated with them).
        lr_ref: the learning rate at B_ref = 32.
        epochs: E, passes over the N units (default 3, or searched when None and ``max_epochs`` is given).
        max_steps: an optional cap on T.
        max_epochs: the cap of ``training.epochs: auto``: E is searched over :data:`EPOCH_GRID` up to it.
        lr_ref_source: where ``lr_ref`` came from (``"training.lr"``, or ``"data.task=…"`` under ``lr: auto``).

    Returns:
        A :class:`Recommendation`; every candidate's ε ≤ target under the same accountant and integer T.

    Raises:
        PlanRefusedError: no candidate is eligible (no B ≤ N, or the target unreachable at every candidate).

    Source: Sander et al. 2023 (σ/B at fixed ε), McKenna et al. 2025 and Rehn et al. 2026 (the best B depends on
    the compute budget E), Panda et al. 2024 (full-batch DP fine-tuning).
    """
    e_options = epoch_options(epochs, max_epochs)
    batches = batch_options(num_units)
    chain = numerical_chain(accountant, adjacency)
    grid: list[tuple[Fraction, int, int]] = []  # (E, B, T), one per distinct (B, T)
    seen: set[tuple[int, int]] = set()
    for e in e_options:
        for batch in batches:
            steps = math.ceil(e * num_units / batch)
            if max_steps is not None:
                steps = min(steps, max_steps)
            if (batch, steps) not in seen:
                seen.add((batch, steps))
                grid.append((e, batch, steps))
    reachable = max((t for _, _, t in grid if t <= MAX_STEPS), default=None)
    floor = step_floor(max_steps, reachable)
    cands: dict[tuple[int, int], Candidate] = {}
    live: dict[tuple[int, int], Fraction] = {}  # eligible by T: (B, T) → E, not yet weighed or ruled out
    for e, batch, steps in grid:
        if steps < floor or steps > MAX_STEPS:
            why = f"T={steps} below the minimum {floor}" if steps < floor else f"T above {MAX_STEPS}"
            cands[(batch, steps)] = _unweighed(batch, steps, num_units, lr_ref, why, e)
        else:
            live[(batch, steps)] = e
    # Only the front of (larger q, fewer T) is calibrated. A candidate with T at least another's and q at most its
    # cannot have a smaller σ/B: at a fixed q the σ that meets ε grows with T (composition), and at a fixed T σ/q
    # does not grow with q (the noise-to-batch ratio: Sander et al. 2023, "TAN without a burn", Fig. 2, flat for
    # large σ and rising as σ falls). A front candidate whose σ cannot be calibrated, or whose ε closed well under
    # the target (TIGHT_SHARE), rules nothing out, and the front is taken again over the rest.
    while live:
        front = [k for k in live if not any(_dominates(k2, k) for k2 in live)]
        for batch, steps in front:
            e = live.pop((batch, steps))
            lr, q = scaled_lr(lr_ref, batch), batch / num_units
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
                why = f"σ not calibrated: {str(err).splitlines()[0]}"
                cands[(batch, steps)] = _cand(batch, steps, q, None, None, lr, why, e)
                continue
            cands[(batch, steps)] = _cand(batch, steps, q, sigma, eps, lr, None, e)
        weighed = [k for k in front if cands[k].excluded is None and cands[k].epsilon >= TIGHT_SHARE * target_epsilon]
        for (batch, steps), e in list(live.items()):
            by = next((k2 for k2 in weighed if _dominates(k2, (batch, steps))), None)
            if by is not None:
                del live[(batch, steps)]
                why = f"not weighed: dominated by B={by[0]}, T={by[1]} (q at least its, T at most its)"
                cands[(batch, steps)] = _unweighed(batch, steps, num_units, lr_ref, why, e)
    ordered = [cands[(b, t)] for _, b, t in grid]
    eligible = [c for c in ordered if c.excluded is None]
    e_text = f"E={float(e_options[0]):g}" if len(e_options) == 1 else f"E up to {float(e_options[-1]):g}"
    if not eligible:
        raise PlanRefusedError(
            f"the planner found no eligible batch for N={num_units}, {e_text}"
            + (f", max steps {max_steps}" if max_steps else "")
            + ": the target ε is not reachable at any candidate; raise privacy.target_epsilon, or set "
            "training.expected_batch_size and training.steps yourself"
        )
    best = min(c.noise_per_unit for c in eligible)
    tied = [c for c in eligible if c.noise_per_unit <= best * (1 + TIE_RTOL)]
    choice = min(tied, key=lambda c: (-c.steps, c.expected_batch_size, c.epochs))
    return Recommendation(
        choice=choice,
        candidates=tuple(ordered),
        epochs=choice.epochs,
        max_steps=max_steps,
        num_units=num_units,
        lr_schedule=DEFAULT_SCHEDULE,
        warmup_steps=DEFAULT_WARMUP_STEPS,
        rule=RULE,
        max_epochs=max_epochs if epochs is None else None,
        min_steps=floor,
        lr_ref=lr_ref,
        lr_ref_source=lr_ref_source,
    )


def _dominates(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether (B, T) ``a`` has q at least and T at most ``b``'s, and is not ``b`` itself (see the front in
    :func:`recommend`)."""
    return a != b and a[0] >= b[0] and a[1] <= b[1]


def _unweighed(batch, steps, num_units, lr_ref, why, epochs) -> Candidate:
    """A candidate ruled out before calibration: no σ, no ε, the reason in ``excluded``."""
    return _cand(batch, steps, batch / num_units, None, None, scaled_lr(lr_ref, batch), why, epochs)


def _cand(batch, steps, q, sigma, eps, lr, excluded, epochs=None) -> Candidate:
    return Candidate(
        epochs=None if epochs is None else float(epochs),
        expected_batch_size=batch,
        steps=steps,
        sample_rate=q,
        noise_multiplier=sigma,
        epsilon=eps,
        noise_per_unit=None if sigma is None else sigma / batch,
        lr=lr,
        excluded=excluded,
    )
