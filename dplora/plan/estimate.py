"""A time estimate before step 1, public by construction.

The estimate is printed on the public job log (``dplora train``) and by ``dplora budget --estimate``, so it must not
depend on the private data at all. Its inputs are, by construction, only:

* the plan's public numbers: T (logical steps still to run), the expected units per logical step B (the contract's
  ``training.expected_batch_size``, or the planner's choice from the declared N), the world size W;
* public contract keys: ``privacy.protected_unit`` (a row is one record) and ``privacy.max_records_per_unit`` (a
  declared bound on records per unit; without it one record per unit is assumed, and the line says so),
  ``training.max_seq_len``, the physical batch (the contract's number, or the value probed on synthetic batches:
  :mod:`dplora.engine.membatch`);
* the wall time of one timed synthetic probe step: a forward and backward through the active per-example path of
  ``physical_batch`` records of ``max_seq_len`` tokens of token id 1 (no data; no optimizer step, no noise, no
  accountant step).

Never a count of the private data (records per unit, record lengths, truncation, the counted N): a record's real
length is at most ``max_seq_len``, so the probe is an upper bound per forward, and real Poisson batches vary around
B. :func:`estimate_inputs` takes no table, unit index or token list, so neighbouring datasets give the same inputs
(``tests/run/test_estimate.py`` checks that on two neighbouring files through ``dplora train``).

estimate = T × ⌈B·r / (W·P)⌉ × s, with r the records per unit bound, P the physical batch and s the probe's seconds.
Forward and backward dominate a LoRA step (``../shared/NOTES.md``: per-sample gradients and noise are cheap), and
the held-out evaluation at the end is not included.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class EstimateInputs:
    """Everything the estimate is computed from (all public; see the module docstring).

    Attributes:
        steps: T, logical steps still to run.
        expected_batch_size: B, expected protected units per logical step (all processes together).
        records_per_unit: r, the declared ``privacy.max_records_per_unit``, else 1 (assumed).
        records_basis: where r comes from: ``row`` (row-level units: one record each), ``cap`` (the declared
            ``privacy.max_records_per_unit``) or ``assumed`` (one record per unit assumed: a unit's count is private).
        world_size: W, processes sharing each logical step.
        physical_batch: P, records per forward.
        max_seq_len: tokens per synthetic probe record.
        probe_seconds: s, wall seconds of one forward and backward of P synthetic records of ``max_seq_len`` tokens.
        device: where the probe ran (``cpu``, ``cuda:0``).
    """

    steps: int
    expected_batch_size: float
    records_per_unit: int
    records_basis: str
    world_size: int
    physical_batch: int
    max_seq_len: int
    probe_seconds: float
    device: str


def estimate_inputs(
    contract, plan, *, physical_batch: int, probe_seconds: float, device: str, world_size: int = 1, done_steps: int = 0
) -> EstimateInputs:
    """The estimate's inputs from the plan's public numbers, public contract keys and the probe's time.

    Args:
        contract: the resolved contract (``privacy.max_records_per_unit``, ``training.max_seq_len``).
        plan: the :class:`dplora.plan.training.TrainingPlan` (``steps``, ``expected_batch_size``).
        physical_batch: records per forward (the contract's, or the synthetic probe's).
        probe_seconds: wall seconds of the timed synthetic probe step.
        device: where it ran.
        world_size: W processes.
        done_steps: logical steps already run (a resumed run).

    Returns:
        :class:`EstimateInputs`. No argument carries data: neither the table, the unit index nor token ids.
    """
    cap = contract.privacy.max_records_per_unit
    row = getattr(contract.privacy.protected_unit, "value", contract.privacy.protected_unit) == "row"
    return EstimateInputs(
        steps=max(int(plan.steps) - int(done_steps), 0),
        expected_batch_size=float(plan.expected_batch_size),
        records_per_unit=1 if row or cap is None else int(cap),
        records_basis="row" if row else "cap" if cap is not None else "assumed",
        world_size=int(world_size),
        physical_batch=int(physical_batch),
        max_seq_len=int(contract.training.max_seq_len),
        probe_seconds=float(probe_seconds),
        device=str(device),
    )


def forwards_per_step(inputs: EstimateInputs) -> int:
    """⌈B·r / (W·P)⌉, at least 1: expected forwards per logical step on one process."""
    per_rank = inputs.expected_batch_size * inputs.records_per_unit / inputs.world_size
    return max(1, math.ceil(per_rank / inputs.physical_batch - 1e-12))


def estimate_seconds(inputs: EstimateInputs) -> float:
    """T × :func:`forwards_per_step` × s, in seconds (see the module docstring)."""
    return inputs.steps * forwards_per_step(inputs) * inputs.probe_seconds


def duration_text(seconds: float) -> str:
    """``seconds`` as ``45 s``, ``12 min`` or ``3 h 20 min`` (rounded: an estimate)."""
    if seconds < 90:
        return f"{max(seconds, 0):.0f} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


def estimate_doc(inputs: EstimateInputs) -> dict:
    """JSON-ready: ``seconds``, ``per_step_seconds``, ``forwards_per_step``, ``inputs`` and the basis in words."""
    per_step = forwards_per_step(inputs) * inputs.probe_seconds
    return {
        "seconds": estimate_seconds(inputs),
        "per_step_seconds": per_step,
        "forwards_per_step": forwards_per_step(inputs),
        "inputs": dataclasses.asdict(inputs),
        "basis": "public: the plan's T and B and a timed synthetic step; never a count of the data",
    }


def estimate_line(inputs: EstimateInputs) -> str:
    """One public line: the estimate, its basis and its assumption about records per unit."""
    per_step = forwards_per_step(inputs) * inputs.probe_seconds
    records = {
        "row": "1 record per unit (row level)",
        "cap": f"≤ {inputs.records_per_unit} records per unit (privacy.max_records_per_unit)",
    }.get(
        inputs.records_basis,
        "1 record per unit assumed (a unit's record count is private; privacy.max_records_per_unit bounds it)",
    )
    return (
        f"estimate: about {duration_text(estimate_seconds(inputs))} for {inputs.steps} steps "
        f"({per_step:.3g} s/step: {forwards_per_step(inputs)} forward(s) of {inputs.physical_batch} synthetic "
        f"records × {inputs.max_seq_len} tokens at {inputs.probe_seconds:.3g} s on {inputs.device}; "
        f"B={inputs.expected_batch_size:g}, {records}); public: from the plan and a timed synthetic step, "
        "not from the data"
    )


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """A time budget such as ``45m``, ``2h``, ``1h30m`` or ``90s`` in seconds (units s, m/min, h, d).

    Returns:
        Seconds, > 0.

    Raises:
        BadInputError: no unit (``45``), zero, a negative or otherwise unreadable value (one line).
    """
    import re

    from dplora.errors import BadInputError

    raw = str(text).strip().lower().replace(" ", "")
    parts = re.findall(r"(\d+(?:\.\d+)?)(min|s|m|h|d)", raw)
    if not raw or not parts or "".join(n + u for n, u in parts) != raw:
        raise BadInputError(
            f"--time-budget {text}: expected a duration with a unit (s, m, h or d), for example 45m, 2h or 1h30m"
        )
    seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if not 0 < seconds < 366 * 86400:
        raise BadInputError(f"--time-budget {text}: expected a duration above 0 and below a year")
    return seconds


def epochs_for_time(inputs: EstimateInputs, num_units: int, budget_seconds: float) -> dict:
    """The epoch budget E that fits ``budget_seconds``, from the synthetic probe (an operator tool, never a clock).

    One epoch is ⌈N·r / (W·P)⌉ forwards of the probe's s seconds (r, W, P as in :func:`estimate_seconds`); E is the
    budget over that, rounded DOWN to a tenth. Public inputs only: the declared N, public contract keys and a
    timed synthetic step, so the E written into a contract never depends on the data or on a run's own timing.

    Args:
        inputs: the probe's :class:`EstimateInputs` (its ``steps`` and B are not used).
        num_units: N, the declared public number of units.
        budget_seconds: the wall-clock budget for training, seconds.

    Returns:
        ``{"budget_seconds", "epoch_seconds", "epochs", "forwards_per_epoch", "probe_seconds", "physical_batch",
        "records_per_unit", "records_basis", "device"}``.

    Raises:
        BadInputError: the budget is shorter than a tenth of an epoch (it names one epoch's time).
    """
    from dplora.errors import BadInputError

    per_rank = num_units * inputs.records_per_unit / inputs.world_size
    forwards = max(1, math.ceil(per_rank / inputs.physical_batch - 1e-12))
    epoch_seconds = forwards * inputs.probe_seconds
    epochs = math.floor(10 * budget_seconds / epoch_seconds) / 10
    if epochs < 0.1:
        raise BadInputError(
            f"--time-budget {duration_text(budget_seconds)} is shorter than a tenth of an epoch here (one epoch of "
            f"N={num_units} is about {duration_text(epoch_seconds)} from the synthetic probe); raise the budget"
        )
    return {
        "budget_seconds": budget_seconds,
        "epoch_seconds": epoch_seconds,
        "epochs": epochs,
        "forwards_per_epoch": forwards,
        "probe_seconds": inputs.probe_seconds,
        "physical_batch": inputs.physical_batch,
        "records_per_unit": inputs.records_per_unit,
        "records_basis": inputs.records_basis,
        "device": inputs.device,
        "basis": "public: the declared N and a timed synthetic step; the plan never changes after the data is read",
    }
