"""The phases of a run that holds its output lock (rank 0), in order: open the staging folder and the ledger, set
up the model and the mechanism, log the public start lines, reserve the charge, train and release, publish.

Each phase cleans up after itself on failure as the run requires: bad input writes nothing, a setup failure leaves
FAILED.json, a training failure settles the ledger for the steps taken (:func:`dplora.recipe.finish.record_failure`).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from dplora.atomic import DiskFullError
from dplora.contract.choices import ProtectedUnit, Quantization
from dplora.contract.spec import PrivacySection, TrainingSection
from dplora.data import digest as digests
from dplora.engine import distributed
from dplora.engine.schedule import step_scheduler
from dplora.errors import DploraError, TrainingFailedError
from dplora.mechanism import control, sampling
from dplora.plan.estimate import estimate_line
from dplora.plan.training import TrainingPlan, ledger_event
from dplora.recipe.build import build_run, open_ledger
from dplora.recipe.finish import failure_entry, memory_kind, peak_memory_gib, record_failure
from dplora.recipe.setup import RunIO, write_json
from dplora.recipe.steps import train_and_release
from dplora.release import envelope as release
from dplora.release.record import unit_statement
from dplora.run import checkpoint as ckpt
from dplora.run import outputs, tracking
from dplora.run import resume as resume_mod
from dplora.run.loop import sharded_base


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timing:
    """A run's wall times (private diagnostics, never released): total, per logical step, held-out evaluation (s)."""

    seconds: float
    seconds_per_step: float
    eval_seconds: float


def open_staging(contract, plan, unit_index, *, out: Path, staging: Path, io: RunIO):
    """Behind one gate: the resume point (with ``--resume``), the ledger with room for the plan, the staging
    folder ``<out>.partial`` and the private log's folder. Returns (resumed checkpoint or None, its data digest or
    None, ledger or None, staging path).

    Raises:
        BadInputError, PlanRefusedError, LedgerError: nothing written.
    """
    with distributed.gate(io.world):  # ranks other than 0 pass the same gate (see train._follow)
        resumed, digest = (
            resume_mod.resume_point(staging, contract.to_yaml(), contract.data, plan, unit_index)
            if io.options.resume
            else (None, None)
        )
        ledger = open_ledger(contract.privacy, plan, io, resumed and resumed.run_id)
        staging = resume_mod.prepare_staging(
            out, resuming=resumed is not None, overwrite=io.options.overwrite, ledger=ledger, log=io.log
        )
        io.private.attach(outputs.private_staging(staging))  # private diagnostics from here on: <output_dir>.private
    return resumed, digest, ledger, staging


def set_up(contract, plan, table, unit_index, *, out: Path, staging: Path, io: RunIO, held_out, resumed):
    """The run's (RunSpec, RunState) built (and restored from ``resumed``), then synchronised across ranks.

    On failure: bad input removes the staging folder (nothing written); any other failure before step 0 work
    leaves FAILED.json (stage ``setup``), which the next run replaces. Raises: whatever the setup raised.
    """
    try:
        with distributed.gate(io.world):
            spec, state = build_run(
                contract, plan, table, unit_index, out=out, staging=staging, io=io, held_out=held_out
            )
            if resumed is not None:  # same run id: the ledger charge is the original reservation
                # the public warm start ran before the checkpoint's first step: its adapters and entry are there
                spec = dataclasses.replace(spec, run_id=resumed.run_id, warm_start=resumed.meta.get("warm_start"))
                ckpt.restore(spec, state, resumed)
                if state.scheduler is not None:  # the schedule is a function of the step: fast-forward it
                    step_scheduler(state.scheduler, state.step)
        distributed.sync_state(io.world, state)  # W processes: every rank starts from rank 0's tensors and counts
    except BaseException as err:
        if getattr(err, "exit_code", None) == 2 and resumed is None:  # bad input: nothing written
            shutil.rmtree(staging, ignore_errors=True)
        elif resumed is None:  # before step 0 work and before the ledger charge: the next run replaces it
            entry = failure_entry(None, 0, plan.steps, 0.0, err) | {"stage": resume_mod.SETUP_STAGE}
            try:  # whole or not at all; a full disk must not hide the original error
                write_json(staging / "FAILED.json", entry)
            except (OSError, DiskFullError):
                pass
        raise
    return spec, state


def log_start(spec, state, io: RunIO, resumed) -> None:
    """The public lines before step 1: the resume note, the plan's warnings, the unit note, the device and
    mechanism line, the control's warning, the distributed line and the time estimate. Public: a function of the
    contract, the plan and the probe on synthetic batches only."""
    log, plan, contract = io.log, spec.plan, spec.contract
    if resumed is not None:
        log(
            f"resuming run {spec.run_id} from its checkpoint at step {state.step}/{plan.steps}; "
            "noise and sampling reseeded from OS entropy"
        )
        note = distributed.resume_note(resumed.meta.get("execution", {}), io.world)
        if note:
            log(note)
    for warning in plan.warnings:  # once the run is set up: bad input (exit 2) prints its one error line only
        log(f"warning: {warning}")
    if contract.privacy.protected_unit is ProtectedUnit.TICKET:
        log(f"note: ticket-level DP {unit_statement(ProtectedUnit.TICKET)}")
    mechanism = (
        f"σ={plan.noise_multiplier:.4f}, ε={plan.epsilon:.4f} ({plan.accountant.value})"
        if spec.mechanism.private
        else "no clipping, no noise, no accountant (non-private control)"
    )
    quantized = Quantization(contract.model.quantization) is not Quantization.NONE
    base = f"NF4 4-bit base, {spec.dtype} compute" if quantized else f"{spec.dtype} base"  # issue 42.10
    log(
        f"device: {spec.device} ({base}, fp32 LoRA), threads: {spec.threads}; N={plan.num_units} units, "
        f"q={plan.sample_rate:.4g}, T={plan.steps}, {mechanism}"
    )
    if not spec.mechanism.private:
        log(f"warning: {control.NO_DP_STATEMENT}")
    if io.world.distributed:
        low, high = sampling.expected_units_per_rank(plan.sample_rate, plan.num_units, io.world.world_size)
        log(
            f"distributed: {io.world.world_size} processes ({io.world.launcher}, {io.world.backend}); units sharded "
            f"by rank, expected {low:.4g}–{high:.4g} units per rank per step; noise drawn once per step on rank 0"
        )
    log_estimate(spec, state, log)


def reserve_charge(ledger, spec, io: RunIO, resumed):
    """:func:`reserve` the run's charge; a refusal of a fresh run removes its staging folder (nothing left behind).
    Then the ledger learns the checkpoint path. Returns the ledger or None. Raises: as :func:`reserve`."""
    try:
        ledger = reserve(ledger, spec.contract.privacy, spec.contract.training, spec.plan, spec, io, resumed)
    except BaseException:
        if resumed is None:  # lost the race for the cap (or any refusal): leave nothing behind, not even .partial
            shutil.rmtree(spec.staging, ignore_errors=True)
        raise
    if ledger is not None:
        ledger.set_checkpoint_path(spec.run_id, str(spec.staging.resolve()))
    return ledger


def train_or_fail(spec, state, io: RunIO, started: str, checkpointer, ledger):
    """The loop, the held-out evaluation and the signed release in staging: (evaluation, train s, eval s).

    Raises:
        KeyboardInterrupt: SIGINT/SIGTERM, one line naming FAILED.json and the resume hint.
        TrainingFailedError: any failure in training (one line); DploraError subclasses that are bad input pass
            through. The failure is recorded first (FAILED.json, the ledger charge for the steps taken).
    """
    try:
        return train_and_release(spec, state, io=io, started=started, checkpointer=checkpointer)
    except BaseException as err:
        record_failure(spec, state, err, ledger, checkpointer.last)
        if isinstance(err, KeyboardInterrupt):
            name = str(err.args[0]) if err.args else "Ctrl-C"
            hint = resume_mod.resume_hint(spec, checkpointer.last)
            failed = spec.staging / "FAILED.json"
            raise KeyboardInterrupt(f"interrupted ({name}); no release was written; see {failed}; {hint}") from None
        if isinstance(err, DploraError) and not isinstance(err, TrainingFailedError | DiskFullError):
            raise
        raise TrainingFailedError(resume_mod.failure_line(err, spec, state, checkpointer.last)) from err


def publish(spec, state, io: RunIO, ledger, *, started: str, timing: Timing) -> float:
    """Move the staging folder to the output (fixed mtimes), write the private diagnostics, settle the ledger and
    record the release. Returns ε spent at the steps taken (the plan's curve at integer T)."""
    plan, out = spec.plan, spec.out
    epsilon_spent = plan.epsilon_at(state.step)
    peak = peak_memory_gib(spec.device)  # private: activations grow with the realised (private) batch
    io.private(f"peak memory: {peak:.2f} GiB ({memory_kind(spec.device)})")
    ckpt.discard(spec.staging)  # a resume checkpoint never leaves the partial folder
    kept = outputs.publish(spec.staging, out)
    outputs.fix_mtimes(out, started)  # released files carry the record's start time, never the run's end
    outputs.fix_mtimes(tracking.tracking_path(out), started)
    io.private.attach(outputs.private_path(out))
    if state.records_zeroed:
        io.private(
            f"{state.records_zeroed} record(s) had a non-finite loss or gradient (an overflow) and contributed zero; "
            "their units were still counted, clipped and noised as usual"
        )
    io.private.put(
        run_id=spec.run_id,
        seconds=round(timing.seconds, 3),
        seconds_per_step=round(timing.seconds_per_step, 3),
        eval_seconds=round(timing.eval_seconds, 3),
        empty_steps=state.empty_steps,
        records_zeroed=state.records_zeroed,
        peak_memory_gib=round(peak, 3),
        note="private diagnostics, computed on the private data and NOT covered by DP: never publish",
    )
    if kept is not None:
        io.log(f"warning: files appeared in {out} during the run; the old folder was kept as {kept}")
    if ledger is not None:
        ledger.settle(spec.run_id, epsilon_spent=epsilon_spent, status="settled")
    if ledger is not None and spec.mechanism.private and io.options.ledger_release:
        ledger.record_release(
            run_id=spec.run_id,
            record_sha256=digests.sha256_file(out / release.RELEASE_FILENAME),
            epsilon=epsilon_spent,
            delta=plan.delta,
            label="final",
        )
    return epsilon_spent


def log_estimate(spec, state, log) -> None:
    """Time one synthetic step and print the public estimate before step 1 (:mod:`dplora.plan.estimate`).

    Its inputs are the plan's public numbers, public contract keys and the probe's time: never the data.
    """
    from dplora.recipe.build import probe_estimate

    if sharded_base(spec) and spec.world.distributed:  # rank 0 cannot forward alone
        log("estimate: not probed under training.sharding: fsdp with several processes (every forward is collective)")
        return
    inputs = probe_estimate(
        spec.contract,
        spec.plan,
        state.model,
        state.optimizer,
        state.named,
        pad_id=spec.pad_id,
        physical=spec.physical_batch_size,
        world_size=spec.world.world_size,
        done_steps=state.step,
    )
    if inputs is None:
        log("estimate: none (the synthetic probe batch did not fit in accelerator memory)")
    elif inputs.steps > 0:
        log(estimate_line(inputs))


def reserve(ledger, privacy: PrivacySection, training: TrainingSection, plan: TrainingPlan, spec, io: RunIO, resumed):
    """Reserve the run's charge and return the ledger it is in (None: not charged, a control without population).

    Under its population; as an unassigned run without one (the ledger, default path or ``--ledger``, is opened
    and created if missing here); ε = ∞ for a non-private control on a population. A resumed run keeps its
    original reservation.

    Raises:
        PlanRefusedError: another run took the room first (the cap is checked again inside the transaction).
        LedgerError: the ledger cannot be created or opened (exit 2).
    """
    if resumed is not None:
        return ledger
    if ledger is None and not privacy.population and not control.is_control(privacy):
        from dplora.ledger.store import Ledger, default_ledger_path

        ledger = Ledger(io.options.ledger_path or default_ledger_path(), create=True)
    if ledger is None:
        return None
    purpose = "tuning" if io.options.tuning_trial else "release"
    if control.is_control(privacy):
        ledger.reserve_non_private(
            population=privacy.population, run_id=spec.run_id, adjacency=plan.adjacency.value, purpose=purpose
        )
        return ledger
    fields = {
        "run_id": spec.run_id,
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "accountant": plan.accountant.value,
        "adjacency": plan.adjacency.value,
        "protected_unit": privacy.protected_unit.value,
        "unit_key": privacy.unit_key,
        "events": [ledger_event(plan)],
        "purpose": purpose,
    }
    population = privacy.population or None  # None: an unassigned run, found by its output folder
    output_dir = None if population else str(Path(training.output_dir).resolve())
    ledger.reserve(population=population, output_dir=output_dir, **fields)
    return ledger
