"""One DP-LoRA run: contract → plan → data → engine → release. Called by ``dplora train``.

Everything that can be checked is checked before a byte is written: contract, signing key, data key,
output folder, data, plan, model, LoRA targets, per-sample gradients. The run writes into
``<output_dir>.partial`` and renames it to ``<output_dir>`` only after the last planned step, the adapters
and the signed release are written. A failed run leaves ``<output_dir>.partial`` with ``FAILED.json`` and its
metrics, never a release.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

from dplora.atomic import DiskFullError
from dplora.contract.spec import Contract, ProtectedUnit, Quantization
from dplora.data import units as data_mod
from dplora.engine import distributed
from dplora.engine.model import check_model_cache
from dplora.errors import BadInputError, DploraError, TrainingFailedError
from dplora.mechanism import control, reduction, sampling
from dplora.plan.training import TrainingPlan, ledger_event
from dplora.recipe.build import build_run, open_ledger
from dplora.recipe.finish import (
    failure_entry,
    memory_kind,
    peak_memory_gib,
    record_failure,
)
from dplora.recipe.inputs import protected_inputs
from dplora.recipe.options import RunOptions
from dplora.recipe.planning import plan_for, resolve_auto
from dplora.recipe.precheck import check_model_files
from dplora.recipe.setup import (
    RunIO,
    lock_output,
    prepare_output,
    quiet_log,
    write_json,
)
from dplora.recipe.steps import check_accounted, train_and_release
from dplora.release import envelope as release
from dplora.release.record import unit_statement
from dplora.run import outputs, tracking
from dplora.run.execution import utc_now


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunResult:
    """What a finished run produced (seconds are wall-clock); ``release_path`` is None on ranks other than 0.

    ``seconds`` is the whole run after setup; ``seconds_per_step`` the loop of steps alone over the steps taken;
    ``eval_seconds`` the held-out evaluation alone (0.0 without one). Printed to the operator, never released.
    """

    output_dir: Path
    release_path: Path | None
    plan: TrainingPlan
    steps_done: int
    empty_steps: int
    epsilon_spent: float
    seconds: float
    seconds_per_step: float
    threads: int
    differentially_private: bool = True
    evaluation: object = None  # dplora.evaluate.heldout.Evaluation when a held-out set is configured
    eval_seconds: float = 0.0
    run_id: str = ""


def run_training(contract: Contract, options: RunOptions | None = None, *, log=print, private_log=None) -> RunResult:
    """Train DP-LoRA adapters under ``contract`` and write them with a signed release record.

    Args:
        contract: the validated contract (overrides applied).
        options: keys, ledger and output policy, threads, progress (:class:`dplora.recipe.options.RunOptions`;
            None: the defaults).
        log: one-line message sink for public lines (a function of the contract, the plan and DP outputs only).
        private_log: a :class:`dplora.surface.PrivateLog` for the private diagnostics (counts, timings, held-out
            numbers, local data warnings); they are written to ``<output_dir>.private/`` and echoed only where
            it echoes. Default: a silent one (the private folder only).

    Returns:
        :class:`RunResult`.

    Raises:
        BadInputError, PlanRefusedError: before anything is written (exit 2); with ``resume``, also no
            checkpoint or a changed contract, data or plan.
        TrainingFailedError: a sanity check, a non-finite loss, out of memory, a full disk (exit 4); no release
            is written, the last resume checkpoint and FAILED.json stay.
        KeyboardInterrupt: SIGINT/SIGTERM; a resume checkpoint of the last finished step is written first.
    """
    from dplora.surface import PrivateLog

    private_log = private_log if private_log is not None else PrivateLog()
    options = options if options is not None else RunOptions()
    signing_key, data_key, ledger_path = options.signing_key, options.data_key, options.ledger_path
    started_at = utc_now()  # before the data is read: the record's only time (its end would time the private run)
    # training.expected_batch_size: auto: B, T and lr from the planner (public inputs only; no data read)
    contract, recommendation = resolve_auto(contract)
    world = distributed.init_world()  # one process unless started by torchrun / accelerate launch
    main = world.is_main  # with W processes only rank 0 reads the keys, locks, charges the ledger and writes
    lock = private_key = key = plan = None
    created: list[Path] = []  # folders above the output that this run creates
    bad_input = False
    out, staging = outputs.output_path(contract.training.output_dir), None  # ranks other than 0 write nothing
    try:
        with distributed.gate(world):  # a refusal on any rank stops every rank here
            tracking.check_backend(contract.training.report_to)  # a missing tracker library: exit 2, nothing written
            if main:
                private_key = release.load_private_key(signing_key)
                key = release.load_data_key(data_key)
                protected = protected_inputs(
                    contract,
                    contract_path=options.contract_path,
                    signing_key=signing_key,
                    data_key=data_key,
                    ledger_path=ledger_path,
                )
                check_model_cache(contract.model)  # a packaged model's cache folder, before any conversion
                check_model_files(contract.model)  # the model folder, before the data is read or σ calibrated
                out, staging = prepare_output(contract, options.overwrite, protected)
            if control.is_control(contract) and world.distributed:
                raise BadInputError("privacy.enabled=false (the non-private control) runs in one process only")
            table, held_out = data_mod.split_eval(data_mod.load_table(contract), contract)
            if options.extra_records:
                table = data_mod.append_records(table, list(options.extra_records))
            unit_index = data_mod.build_unit_index(table, contract.privacy, seed=contract.training.seed)
            if main:
                plan = plan_for(contract, unit_index, log=private_log)
                if recommendation is not None:
                    plan = dataclasses.replace(plan, planner=recommendation.to_dict())
                if control.is_control(contract):  # the DP twin's N, q and T; σ = 0, ε = ∞
                    plan = control.control_plan(plan)
                created = outputs.missing_parents(out)  # removed again if the run ends in exit 2
                lock = lock_output(out)
                # re-check under the lock: another run may have finished meanwhile
                prepare_output(contract, options.overwrite, protected)
        plan = distributed.broadcast(world, plan)  # one plan (q, T, σ, ε curve), computed on rank 0
        if world.distributed:  # every rank read the same rows in the same order, the same contract and plan
            distributed.check_same_inputs(world, distributed.input_digests(contract, plan, table, unit_index))
        io = RunIO(
            options=options,
            private_key=private_key,
            data_key=key,
            progress=options.progress and main,
            log=log if main else quiet_log,
            world=world,
            private=private_log if main else PrivateLog(),
            started_at=started_at,
        )
        if not main:
            return _follow(contract, plan, table, unit_index, out=out, staging=staging, io=io)
        return _run_locked(contract, plan, table, unit_index, out=out, staging=staging, io=io, held_out=held_out)
    except BaseException as err:
        bad_input = getattr(err, "exit_code", None) == 2
        raise
    finally:
        if lock is not None:
            Path(lock.name).unlink(missing_ok=True)
            lock.close()
        if bad_input:  # bad input writes nothing: not even the folders above the output
            outputs.remove_empty_folders(created)
        elif created:  # the folders this run made above the output carry the record's start, never the end
            outputs.stamp_folders(created, started_at)
        distributed.finish(world)


def _run_locked(
    contract: Contract, plan: TrainingPlan, table, unit_index, *, out: Path, staging: Path, io: RunIO, held_out=None
):
    """The run proper, holding the output lock: ledger check, model and engine, the loop, the release."""
    log = io.log
    from dplora.run import checkpoint as ckpt
    from dplora.run import resume as resume_mod

    resumed = digest = None
    with distributed.gate(io.world):  # ranks other than 0 pass the same gate (see _follow)
        resumed, digest = (
            resume_mod.resume_point(staging, contract, plan, unit_index) if io.options.resume else (None, None)
        )
        ledger = open_ledger(contract, plan, io, resumed and resumed.run_id)
        staging = resume_mod.prepare_staging(
            out, resuming=resumed is not None, overwrite=io.options.overwrite, ledger=ledger, log=log
        )
        io.private.attach(outputs.private_staging(staging))  # private diagnostics from here on: <output_dir>.private
    try:
        with distributed.gate(io.world):
            spec, state = build_run(
                contract, plan, table, unit_index, out=out, staging=staging, io=io, held_out=held_out
            )
            if resumed is not None:  # same run id: the ledger charge is the original reservation
                spec = dataclasses.replace(spec, run_id=resumed.run_id)
                ckpt.restore(spec, state, resumed)
                if state.scheduler is not None:  # the schedule is a function of the step: fast-forward it
                    from dplora.engine.schedule import step_scheduler

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
        "no clipping, no noise, no accountant (non-private control)"
        if control.is_control(contract)
        else f"σ={plan.noise_multiplier:.4f}, ε={plan.epsilon:.4f} ({plan.accountant.value})"
    )
    quantized = Quantization(contract.model.quantization) is not Quantization.NONE
    base = f"NF4 4-bit base, {spec.dtype} compute" if quantized else f"{spec.dtype} base"  # issue 42.10
    log(
        f"device: {spec.device} ({base}, fp32 LoRA), threads: {spec.threads}; N={plan.num_units} units, "
        f"q={plan.sample_rate:.4g}, T={plan.steps}, {mechanism}"
    )
    if control.is_control(contract):
        log(f"warning: {control.NO_DP_STATEMENT}")
    if io.world.distributed:
        low, high = sampling.expected_units_per_rank(plan.sample_rate, plan.num_units, io.world.world_size)
        log(
            f"distributed: {io.world.world_size} processes ({io.world.launcher}, {io.world.backend}); units sharded "
            f"by rank, expected {low:.4g}–{high:.4g} units per rank per step; noise drawn once per step on rank 0"
        )
    _log_estimate(spec, state, log)
    try:
        ledger = _reserve(ledger, contract, plan, spec, io, resumed)
    except BaseException:
        if resumed is None:  # lost the race for the cap (or any refusal): leave nothing behind, not even .partial
            shutil.rmtree(staging, ignore_errors=True)
        raise
    if ledger is not None:
        ledger.set_checkpoint_path(spec.run_id, str(staging.resolve()))
    started = resumed.meta["started_at"] if resumed is not None else io.started_at
    checkpointer = ckpt.Checkpointer(
        spec, state, started_at=started, data_digest=digest or ckpt.data_sha256(contract), log=log, last=resumed
    )
    t0, first_step = time.perf_counter(), state.step
    try:
        evaluation, train_seconds, eval_seconds = train_and_release(
            spec, state, io=io, started=started, checkpointer=checkpointer
        )
        seconds = time.perf_counter() - t0
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
    epsilon_spent = plan.epsilon_at(state.step)
    peak = peak_memory_gib(spec.device)  # private: activations grow with the realised (private) batch
    io.private(f"peak memory: {peak:.2f} GiB ({memory_kind(spec.device)})")
    ckpt.discard(staging)  # a resume checkpoint never leaves the partial folder
    kept = outputs.publish(staging, out)
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
        seconds=round(seconds, 3),
        seconds_per_step=round(train_seconds / max(plan.steps - first_step, 1), 3),
        eval_seconds=round(eval_seconds, 3),
        empty_steps=state.empty_steps,
        records_zeroed=state.records_zeroed,
        peak_memory_gib=round(peak, 3),
        note="private diagnostics, computed on the private data and NOT covered by DP: never publish",
    )
    if kept is not None:
        log(f"warning: files appeared in {out} during the run; the old folder was kept as {kept}")
    if ledger is not None:
        ledger.settle(spec.run_id, epsilon_spent=epsilon_spent, status="settled")
    if ledger is not None and not control.is_control(contract) and io.options.ledger_release:
        ledger.record_release(
            run_id=spec.run_id,
            record_sha256=release.sha256_file(out / release.RELEASE_FILENAME),
            epsilon=epsilon_spent,
            delta=plan.delta,
            label="final",
        )
    return RunResult(
        output_dir=out,
        release_path=out / release.RELEASE_FILENAME,
        plan=plan,
        steps_done=state.step,
        empty_steps=state.empty_steps,
        epsilon_spent=epsilon_spent,
        seconds=seconds,
        seconds_per_step=train_seconds / max(plan.steps - first_step, 1),  # the loop alone, not the evaluation
        eval_seconds=eval_seconds,
        threads=spec.threads,
        differentially_private=not control.is_control(contract),
        evaluation=evaluation,
        run_id=spec.run_id,
    )


def _log_estimate(spec, state, log) -> None:
    """Time one synthetic step and print the public estimate before step 1 (:mod:`dplora.plan.estimate`).

    Its inputs are the plan's public numbers, public contract keys and the probe's time: never the data.
    """
    from dplora.plan.estimate import estimate_line
    from dplora.recipe.build import probe_estimate

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


def _reserve(ledger, contract: Contract, plan: TrainingPlan, spec, io: RunIO, resumed):
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
    if ledger is None and not contract.privacy.population and not control.is_control(contract):
        from dplora.ledger.store import Ledger, default_ledger_path

        ledger = Ledger(io.options.ledger_path or default_ledger_path(), create=True)
    if ledger is None:
        return None
    purpose = "tuning" if io.options.tuning_trial else "release"
    if control.is_control(contract):
        ledger.reserve_non_private(
            population=contract.privacy.population, run_id=spec.run_id, adjacency=plan.adjacency.value, purpose=purpose
        )
        return ledger
    fields = {
        "run_id": spec.run_id,
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "accountant": plan.accountant.value,
        "adjacency": plan.adjacency.value,
        "protected_unit": contract.privacy.protected_unit.value,
        "unit_key": contract.privacy.unit_key,
        "events": [ledger_event(plan)],
        "purpose": purpose,
    }
    if contract.privacy.population:
        ledger.reserve(population=contract.privacy.population, **fields)
    else:
        ledger.reserve_unassigned(output_dir=str(Path(contract.training.output_dir).resolve()), **fields)
    return ledger


def _follow(contract: Contract, plan: TrainingPlan, table, unit_index, *, out: Path, staging: None, io: RunIO):
    """A rank other than 0: the same gates, engine and steps as rank 0 on its shard; writes nothing (no staging).

    Raises:
        DploraError: this rank's failure or, through a gate or the step's reduction, another rank's.
    """
    import os

    from dplora.run.loop import run_steps
    from dplora.run.progress import ProgressReporter

    with distributed.gate(io.world):  # rank 0 reads a resume checkpoint and checks the ledger here
        pass
    with distributed.gate(io.world):  # rank 0 also restores a resume checkpoint here
        spec, state = build_run(contract, plan, table, unit_index, out=out, staging=staging, io=io)
    distributed.sync_state(io.world, state)  # rank 0's LoRA tensors, optimizer state and step counts
    t0, first_step = time.perf_counter(), state.step
    signals = reduction.FollowerSignals(state.optimizer.reducer)
    with open(os.devnull, "w") as metrics, ProgressReporter(enabled=False) as bar, signals:
        run_steps(spec, state, metrics=metrics, progress=bar, after_step=signals.after_step)
    check_accounted(spec, state)
    seconds = time.perf_counter() - t0
    return RunResult(
        output_dir=out,
        release_path=None,
        plan=plan,
        steps_done=state.step,
        empty_steps=state.empty_steps,
        epsilon_spent=plan.epsilon_at(state.step),
        seconds=seconds,
        seconds_per_step=seconds / max(plan.steps - first_step, 1),
        threads=spec.threads,
    )
