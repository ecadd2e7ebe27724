"""The state of one DP-LoRA run and its loop: exactly T logical steps, each one DP-SGD step.

:class:`RunSpec` is the frozen description of the run (its compiled config, protected units, tokens, device,
dtype, paths); :class:`RunState` is what changes as it runs (step count, empty steps, the engine's model, optimizer and
accountant). :func:`run_steps` reads as the step it is (Abadi et al. 2016, Alg. 1, over protected units as in
Charles et al. 2024, arXiv 2407.07737):

    check ε after this step ≤ target → Poisson-sample units → per-record gradients in physical batches,
    summed per unit → clip per unit, sum, add N(0, σ²C²) once, divide by the public normaliser → optimizer
    step → accountant step.

On a GPU the loop reads one value pair back to the host per logical step (the loss sum, for progress and the
non-finite check, and a flag that every trainable tensor is finite), never one per physical batch or tensor.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dplora import atomic
from dplora.data.units import UnitIndex
from dplora.engine import distributed
from dplora.errors import NoisyUpdateError, TrainingFailedError
from dplora.mechanism.core import DPMechanism
from dplora.mechanism.reduction import common_forward_count
from dplora.plan.training import TrainingPlan
from dplora.run.config import RunConfig

if TYPE_CHECKING:
    import datasets
    import torch
    from transformers import PreTrainedTokenizerBase


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What one run is, fixed before its first step.

    Attributes:
        config: the compiled settings (:class:`dplora.run.config.RunConfig`: plan, performance flags, processes).
        unit_index: protected units → record indices (records of a unit are contiguous in a batch).
        examples: (input_ids, labels) per record, token ids; private, never logged.
        pad_id: the tokenizer's pad token id.
        device: where the trainable parameters and every engine tensor live (a ``torch.device``).
        dtype: base-weight dtype, "bf16" | "fp32" (LoRA tensors and the DP arithmetic are always fp32).
        allow_tf32: TF32 for fp32 matmuls (CUDA only).
        threads: CPU threads used.
        run_id: 32 hex characters, the ledger and record id.
        out: the final output folder; staging: ``<out>.partial`` where the run writes meanwhile.
        mechanism: the run's :class:`dplora.mechanism.core.DPMechanism` (sampler, private or control); None only
            for a measurement on public data that runs no logical step (``dplora clip-guide``).
        tokenizer: the tokenizer (for the held-out evaluation), or None.
        tokenization: the record's ``tokenization`` entry (:func:`dplora.data.chat.tokenization_entry`), or None.
        held_out: the held-out records (``datasets.Dataset``; private unless declared public), or None.
        physical_batch: records per forward resolved before step 1 (``training.physical_batch_size: auto`` probed by
            :func:`dplora.engine.membatch.probe_physical_batch`), or None to use the configured number.
        attn_implementation: the attention kernel the model loaded with ("sdpa", "eager", ...; ``auto`` resolved
            by :func:`dplora.engine.model.resolve_attn_implementation`), or None for the configured value.
        warm_start: the release record's ``public_warm_start`` entry (:func:`dplora.engine.warmstart.warm_start`;
            from the checkpoint on resume), or None without ``data.public_warm_start``.
    """

    config: RunConfig
    unit_index: UnitIndex
    examples: list[tuple[list[int], list[int]]]
    pad_id: int
    device: torch.device
    dtype: str
    allow_tf32: bool
    threads: int
    run_id: str
    out: Path
    staging: Path
    mechanism: DPMechanism | None
    tokenizer: PreTrainedTokenizerBase | None = None
    tokenization: dict | None = None
    held_out: datasets.Dataset | None = None
    physical_batch: int | None = None
    attn_implementation: str | None = None
    warm_start: dict | None = None

    @property
    def plan(self) -> TrainingPlan:
        """The compiled plan (``config.plan``)."""
        return self.config.plan

    @property
    def world(self) -> distributed.World:
        """The run's processes (``config.world``)."""
        return self.config.world

    @property
    def physical_batch_size(self) -> int:
        """Records per forward pass before any out-of-memory retry (memory only; not a privacy setting)."""
        if self.physical_batch is not None:
            return self.physical_batch
        return self.config.flags.fixed_physical_batch_size


@dataclasses.dataclass(kw_only=True)
class RunState:
    """What changes during a run: the engine's parts and the step counters.

    Attributes:
        model: the per-sample-gradient wrapper around the peft model (Opacus ``GradSampleModule``).
        optimizer: the :class:`dplora.mechanism.optimizer.UnitDPOptimizer` (clip per unit, noise, normalise, step hook).
        accountant: the :class:`dplora.mechanism.optimizer.StepAccountant`, stepped by the optimizer on every logical
        step.
        named: (name, parameter) of every trainable LoRA tensor.
        step: logical steps done (equals ``accountant.steps`` between steps).
        empty_steps: logical steps whose Poisson batch was empty.
        physical_batch: records per forward after out-of-memory retries (0: ``spec.physical_batch_size``); halved
            each time a step runs out of accelerator memory and is re-run on the same units.
        oom_retries: logical steps re-run after an out-of-memory error (never re-sampled, noised or accounted twice).
        records_zeroed: records whose loss or per-example gradient was non-finite, each a zero contribution (a
            private count: ``<output_dir>.private/report.json`` only).
        scheduler: the learning-rate scheduler (:mod:`dplora.engine.schedule`), stepped after every logical step.
    """

    model: Any
    optimizer: Any
    accountant: Any
    named: list
    step: int = 0
    empty_steps: int = 0
    physical_batch: int = 0
    oom_retries: int = 0
    scheduler: Any = None
    records_zeroed: int = 0


METRICS_HEADER = {
    "note": "fields under not_covered_by_dp are computed on private data and are not covered by ε; "
    "they never enter the release record"
}


def _batches(spec: RunSpec, units) -> tuple[list[int], Any, Any]:
    """Rows of the sampled units in unit order, each row's local unit index (0..U-1), shape (R,), and each row's
    weight in its unit's vector, shape (R,) (1 / records of its unit; used by ``unit_clipping: mean``)."""
    import numpy as np

    records = spec.unit_index.records_of_unit
    rows = [r for u in units for r in records[u]]
    if not len(units):
        return rows, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    sizes = np.array([len(records[u]) for u in units], dtype=np.int64)
    local = np.repeat(np.arange(len(units), dtype=np.int64), sizes)
    return rows, local, np.repeat(1.0 / sizes, sizes).astype(np.float32)


def finite_flag(named):
    """A 0-d bool tensor on the parameters' device: every trainable tensor is finite (no host sync)."""
    import torch

    norms = torch._foreach_norm([p.detach() for _, p in named])
    return torch.isfinite(torch.stack(norms).sum())


def forward_backward(spec: RunSpec, state: RunState, units) -> tuple[float, int]:
    """This process's records of ``units``: per-record gradients, summed and clipped per unit into the optimizer.

    Returns:
        (summed per-sequence loss in nats, 0.0 for no records; records used).

    Out of accelerator memory (``torch.OutOfMemoryError``), the same records of the same ``units`` are re-run from
    an empty per-unit sum with half the physical batch (kept for later steps), down to one record per forward; on
    the fast path only (Opacus hooks count forwards per parameter, so an error mid-model cannot be undone there).

    Raises:
        TrainingFailedError: a non-finite loss, or a trainable tensor that became non-finite in the previous step.
        torch.OutOfMemoryError: one record per forward still does not fit.
    """
    from dplora.engine import membatch

    rows, local, weight = _batches(spec, units)
    while True:
        physical = state.physical_batch or spec.physical_batch_size
        try:
            return _physical_batches(spec, state, units, rows, local, weight, physical)
        except Exception as err:
            if not membatch.is_oom(err) or physical <= 1 or getattr(state.optimizer, "flat", None) is None:
                raise  # the Opacus path cannot be retried mid-step (its hooks count forwards): exit 4, resumable
            if sharded_base(spec):
                raise  # FSDP: the other ranks are inside the same collectives; a retry here would desync them
        # Out of accelerator memory: the SAME units again, from an empty per-unit sum, with half the records per
        # forward. Nothing was noised or accounted yet (both happen once, in optimizer.step() after this returns).
        membatch.reset_after_oom(state.model, state.optimizer, state.named)
        state.physical_batch = max(1, physical // 2)
        state.oom_retries += 1


class CaughtUpFailure(Exception):
    """This rank's part of a step under ``training.sharding: fsdp`` failed OUTSIDE any collective forward (while
    collating, arming or clipping into the per-unit sum, or at the step's host read), and the rank has since run
    the padding forwards its peers expect in this step: it can report the failure through the step's reduction.

    Attributes:
        error: the failure itself (re-raised by this rank at the reduction).
    """

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def _physical_batches(spec: RunSpec, state: RunState, units, rows, local, weight, physical: int) -> tuple[float, int]:
    """The records ``rows`` of ``units`` in physical batches of ``physical``, into the optimizer's per-unit sum.

    Raises:
        CaughtUpFailure: (FSDP, W processes) a failure outside this rank's collective forwards, after the rank ran
            the step's remaining forwards as padding, so that it can still join the step's reduction.
        Exception: any other failure, at once (one inside a forward or backward under FSDP: the peers wait in that
            forward's collectives, which no flag can reach; this rank's exit, or the collective timeout, ends them).
    """
    import torch

    optimizer = state.optimizer
    padding, forwards, inside = 0, 0, False
    caught_up = sharded_base(spec) and spec.world.distributed
    if sharded_base(spec):  # FSDP: every forward is collective; agree on the count BEFORE any rank forwards
        batches = -(-len(rows) // physical)
        padding = common_forward_count(spec.world, batches, spec.device) - batches
    total = -(-len(rows) // physical) + padding  # the step's collective forwards on every rank (FSDP)
    try:
        optimizer.begin_logical_step(len(units))
        loss_sum = torch.zeros((), device=spec.device)
        for start in range(0, len(rows), physical):
            end = min(start + physical, len(rows))
            batch = _collate(spec, rows[start:end])
            optimizer.prepare_batch(end - start)
            forwards, inside = forwards + 1, True
            losses, finite = _forward_backward(state.model, batch)
            inside = False
            optimizer.accumulate(
                torch.as_tensor(local[start:end], device="cpu"),  # host-side bookkeeping: no device sync
                continues=bool(end < len(rows) and local[end] == local[end - 1]),
                row_weight=torch.as_tensor(weight[start:end], device="cpu"),
                finite_rows=finite,
            )
            loss_sum += torch.where(finite, losses.detach(), 0.0).sum()
        for _ in range(padding):  # FSDP: this rank's extra forwards carry no record (the ranks ran as many in all)
            forwards, inside = forwards + 1, True
            _padding_forward(spec, state)
            inside = False
        zeroed = getattr(getattr(optimizer, "accumulator", None), "zeroed", None)
        zeroed = torch.zeros((), device=spec.device) if zeroed is None else zeroed
        # The one host read per logical step: the loss sum, "all parameters finite after the last step" (a function
        # of DP outputs: the only stop rule), and the records zeroed for an overflow (a private count).
        loss_value, params_ok, zeroed_rows = torch.stack(
            [loss_sum.float(), finite_flag(state.named).float(), zeroed.to(loss_sum.device).float()]
        ).tolist()
        if params_ok != 1.0:
            raise NoisyUpdateError(f"non-finite parameter after step {state.step}")
    except Exception as err:
        if not caught_up or inside:
            raise
        # Between two collective forwards the peers are about to enter the next one: run this rank's remaining
        # forwards of the step as padding (rows discarded, nothing summed), so that every rank then meets at the
        # step's reduction, which carries the failure to all of them. If a padding forward fails too, the rank
        # raises at once, as for a failure inside a forward.
        try:
            for _ in range(total - forwards):
                _padding_forward(spec, state)
        except Exception:  # noqa: BLE001 - the first failure is the one reported
            raise err from None
        raise CaughtUpFailure(err) from err
    state.records_zeroed += int(zeroed_rows)
    return loss_value, len(rows)


def _collate(spec: RunSpec, rows) -> dict:
    """One physical batch of the records ``rows`` (padded tensors on the run's device)."""
    from dplora.engine import batch as batching

    return batching.collate([spec.examples[r] for r in rows], spec.pad_id, device=spec.device)


def _forward_backward(model, batch):
    """One physical batch's forward and backward: (per-record losses, per-record "loss is finite" flags)."""
    import torch

    from dplora.engine import batch as batching

    losses = batching.per_sequence_loss(model, batch)
    # A record whose loss overflows contributes zero: it is left out of the backward, and the optimizer zeroes its
    # per-example row (and any row that overflows in the backward) after it is formed. Its unit still counts;
    # noise and the accountant step are unchanged; only a count reaches the private log.
    finite = torch.isfinite(losses.detach())
    torch.where(finite, losses, torch.zeros_like(losses)).sum().backward()
    return losses, finite


def sharded_base(spec: RunSpec) -> bool:
    """``training.sharding: fsdp``: the base is sharded over the ranks, so with W > 1 every forward is collective
    (no rank may forward alone: the time estimate's probe and the held-out evaluation are skipped)."""
    return spec.config.sharded_base


def _padding_forward(spec: RunSpec, state: RunState) -> None:
    """One forward and backward of a record with no target token (two pad tokens, labels −100) whose per-example
    rows are discarded: it only lets this rank join the other ranks' FSDP collectives. Its loss is exactly 0
    (:func:`dplora.engine.batch.per_sequence_loss`), it belongs to no unit, and nothing of it is added or counted."""
    from dplora.engine import batch as batching

    pad = [spec.pad_id, spec.pad_id]
    batch = batching.collate([(pad, [batching.IGNORE_INDEX] * 2)], spec.pad_id, device=spec.device)
    state.optimizer.prepare_batch(1)
    batching.per_sequence_loss(state.model, batch).sum().backward()
    state.optimizer.discard_batch()


def logical_step(spec: RunSpec, state: RunState, units) -> tuple[float | None, int]:
    """One DP-SGD step over the sampled ``units`` (shape (U,) unit indices; U = 0 happens).

    With W processes ``units`` are this rank's; the step's one all-reduce adds the ranks' clipped sums, and the
    returned loss and record count are totals over all ranks. A failure in this rank's part does not leave the
    others waiting: the rank still joins the reduction with a failure flag (that all-reduce carries it: no extra
    collective), and every rank raises there, rank 0 naming the failing rank. Under ``training.sharding: fsdp``
    the same holds for a failure outside the collective forwards (the rank first runs its remaining forwards as
    padding, :class:`CaughtUpFailure`); a failure inside a forward or backward raises at once: the others wait in
    that forward's collectives, which end when this rank exits or at the collective timeout
    (:data:`dplora.engine.distributed.COLLECTIVE_TIMEOUT_S`), and rank 0 records its own error.

    Returns:
        (summed per-sequence loss over the step's records in nats, or None for an empty batch; records used).

    Raises:
        TrainingFailedError: a non-finite loss (the step is not taken and not counted), a trainable tensor
            that became non-finite in the previous step, or (W processes) another rank's failure.
    """
    reducer = getattr(state.optimizer, "reducer", None)
    try:
        loss_value, records = forward_backward(spec, state, units)
    except CaughtUpFailure as failed:  # FSDP: this rank ran the step's remaining forwards: it joins the reduction
        reducer.fail(failed.error)
        loss_value, records = 0.0, 0
    except Exception as err:
        if reducer is None or sharded_base(spec):
            # FSDP, a failure inside a forward: the other ranks wait inside this step's collective forwards, not at
            # the reduction (joining the reduction would deadlock every rank); this rank's exit ends their
            # collectives with an error, and rank 0 records the failure and keeps its last resume checkpoint
            raise
        reducer.fail(err)
        loss_value, records = 0.0, 0
    if reducer is not None:
        reducer.set_local(len(units), records, loss_value)
    state.optimizer.step()  # clip per unit, noise once, normalise, optimizer step, accountant step
    state.optimizer.zero_grad(set_to_none=True)
    if state.scheduler is not None:  # data-independent: a function of the step count
        state.scheduler.step()
    if reducer is not None:
        loss_value, records = reducer.totals["loss_sum"], int(reducer.totals["records"])
    return (loss_value if records else None), records


def run_steps(spec: RunSpec, state: RunState, *, metrics, progress, after_step=None) -> None:
    """Run logical steps ``state.step + 1 .. plan.T``; stop before any step whose ε would pass the target.

    Args:
        spec, state: the run.
        metrics: a text file for one JSON line per step (``metrics.jsonl``).
        progress: a :class:`dplora.run.progress.ProgressReporter` (``update(step, epsilon, seconds_per_step, loss)``).
        after_step: called as ``after_step(spec, state)`` after each step is applied and logged (resume
            checkpoints, :class:`dplora.run.checkpoint.Checkpointer`); it may raise to stop between steps.

    Raises:
        TrainingFailedError: the budget check, a non-finite value, or a LoRA tensor that did not move at step 1.
    """

    from dplora.engine import gradcheck

    plan = spec.plan
    sampler = spec.mechanism.sampler(spec.unit_index.num_units)  # OS entropy, never the seed
    # Every LoRA tensor must move at step 1 (noise moves them all). A non-private control is exempt: lora_B starts
    # at zero, so lora_A's gradient is exactly zero at step 1 (Hu et al. 2021) and only noise would move it.
    check_moved = state.step == 0 and spec.mechanism.private
    before = {n: p.detach().clone() for n, p in state.named} if check_moved else None
    while state.step < plan.steps:
        step = state.step + 1
        eps_next = plan.epsilon_at(step)  # raises beyond T: the budget stop
        if eps_next > plan.target_epsilon:
            raise TrainingFailedError(f"step {step} would spend ε={eps_next:.4f} > target")
        t_step = time.perf_counter()
        units = sampler.sample()
        loss_sum, records = logical_step(spec, state, units)
        state.step = step
        state.empty_steps += records == 0
        if before is not None:
            gradcheck.check_all_moved(before, state.named)
            before = None
        seconds = time.perf_counter() - t_step
        mean_loss = loss_sum / records if records else None
        progress.update(step, eps_next, seconds, mean_loss)
        atomic.append_line(  # one whole line per step, fsynced: a full disk leaves no partial line
            metrics,
            json.dumps(
                {
                    "step": step,
                    "epsilon_upper": eps_next if math.isfinite(eps_next) else None,  # None: a non-private control
                    "seconds": round(seconds, 3),
                    "not_covered_by_dp": {"train_loss": mean_loss, "units": _units(state, units), "records": records},
                    **_noise_draws(state),
                }
            ),
        )
        if after_step is not None:
            after_step(spec, state)
    if float(finite_flag(state.named)) != 1.0:
        raise NoisyUpdateError(f"non-finite parameter after step {state.step}")


def _units(state: RunState, units) -> int:
    """Units in the step: this process's sample, or with W processes the total over all ranks."""
    reducer = getattr(state.optimizer, "reducer", None)
    return len(units) if reducer is None else int(reducer.totals["units"])


def _noise_draws(state: RunState) -> dict:
    """With W processes, the step's noise draws over all ranks (public; the reduction checked it is 1)."""
    reducer = getattr(state.optimizer, "reducer", None)
    return {} if reducer is None else {"noise_draws": int(reducer.totals["noise_draws"])}


def check_accounted(spec, state) -> list[dict] | None:
    """Every planned step taken and accounted; with W processes, on every rank, with identical adapters.

    Returns:
        With W processes, each rank's accountant steps and adapter digest (for the record); else None.

    Raises:
        TrainingFailedError: a step count differs from the plan, or the ranks disagree (no release).
    """
    if state.accountant.steps != spec.plan.steps or state.step != spec.plan.steps:  # never release unaccounted
        raise TrainingFailedError(f"accounted {state.accountant.steps} steps, planned {spec.plan.steps}: no release")
    if not spec.world.distributed:
        return None
    from dplora.engine.perexample import unwrap

    model = unwrap(state.model)
    digest = distributed.adapter_digest(model)
    held = None
    if sharded_base(spec):  # each rank's share of the base, counted from its shards
        from dplora.engine.sharding import local_base_parameters

        held = local_base_parameters(model)[0]
    return distributed.check_agreement(spec.world, steps=state.accountant.steps, digest=digest, base_parameters=held)
