"""One DP-LoRA run: contract → plan → data → engine → release. Called by ``dplora train``.

Everything that can be checked is checked before a byte is written: contract, signing key, data key,
output folder, data, plan, model, LoRA targets, per-sample gradients. The run writes into
``<output_dir>.partial`` and renames it to ``<output_dir>`` only after the last planned step, the adapters
and the signed release are written. A failed run leaves ``<output_dir>.partial`` with ``FAILED.json`` and its
metrics, never a release.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from pathlib import Path

from dplora.contract.spec import Contract
from dplora.data import units as data_mod
from dplora.engine import distributed
from dplora.engine.model import check_model_cache
from dplora.errors import BadInputError, DploraError, TrainingFailedError
from dplora.mechanism import control, reduction
from dplora.plan.training import TrainingPlan
from dplora.recipe import phases
from dplora.recipe.build import build_run
from dplora.recipe.inputs import protected_inputs
from dplora.recipe.options import RunOptions
from dplora.recipe.planning import plan_for, resolve_auto
from dplora.recipe.precheck import check_model_files, check_warm_start_file
from dplora.recipe.setup import (
    RunIO,
    lock_output,
    prepare_output,
    quiet_log,
)
from dplora.recipe.steps import check_accounted
from dplora.release import envelope as release
from dplora.release import keys as release_keys
from dplora.run import checkpoint as ckpt
from dplora.run import outputs, resume, tracking
from dplora.run.execution import utc_now
from dplora.run.progress import ProgressReporter
from dplora.surface import PrivateLog


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
    private_log = private_log if private_log is not None else PrivateLog()
    options = options if options is not None else RunOptions()
    started_at = utc_now()  # before the data is read: the record's only time (its end would time the private run)
    # training.expected_batch_size: auto: B, T and lr from the planner (public inputs only; no data read)
    contract, recommendation = resolve_auto(contract)
    world = distributed.init_world()  # one process unless started by torchrun / accelerate launch
    held = _Held()  # the output lock and the folders above the output this run creates, released in `finally`
    bad_input = False
    try:
        admitted = _admit(contract, options, world, recommendation, held, private_log)
        io = RunIO(
            options=options,
            private_key=admitted.private_key,
            data_key=admitted.data_key,
            progress=options.progress and world.is_main,
            log=log if world.is_main else quiet_log,
            world=world,
            private=private_log if world.is_main else PrivateLog(),
            started_at=started_at,
        )
        if admitted.note:  # a launcher's FSDP settings that dplora does not apply (public: env and contract only)
            io.log(admitted.note)
        run = (admitted.plan, admitted.table, admitted.unit_index)
        if not world.is_main:
            return _follow(contract, *run, out=admitted.out, staging=admitted.staging, io=io)
        return _run_locked(
            contract, *run, out=admitted.out, staging=admitted.staging, io=io, held_out=admitted.held_out
        )
    except BaseException as err:
        bad_input = getattr(err, "exit_code", None) == 2
        # The error's traceback keeps the failed stages' locals (the model) alive; drop them so `finish` frees the
        # model before it leaves the process group (see dplora.engine.distributed.finish).
        _drop_frames(err)
        raise
    finally:
        held.release(bad_input=bad_input, started_at=started_at)
        distributed.finish(world)


def _drop_frames(err: BaseException) -> None:
    """Clear the locals of the finished frames in ``err``'s traceback and in those of the errors it chains."""
    pending, seen = [err], set()
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        pending += [e.__cause__, e.__context__]


@dataclasses.dataclass
class _Held:
    """What a run holds until it ends: the output lock and the folders above the output it created."""

    lock: object = None
    created: list[Path] = dataclasses.field(default_factory=list)
    above: outputs.FolderTimes | None = None  # the nearest folder above the output that existed before the run

    def release(self, *, bad_input: bool, started_at: str) -> None:
        """Unlock; after bad input remove the folders this run created (it writes nothing), else stamp them with
        the record's start time (never the end); then give the folder above them its times from before the run.

        This is the run's last change to that folder (the lock's removal, after the release and ``.private/``
        were renamed into place and ``.partial/`` went away), so its mtime does not time the private run."""
        if self.lock is not None:
            Path(self.lock.name).unlink(missing_ok=True)
            self.lock.close()
        if bad_input:
            outputs.remove_empty_folders(self.created)
        elif self.created:
            outputs.stamp_folders(self.created, started_at)
        if self.above is not None:
            self.above.restore()


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Admitted:
    """A run past its checks: keys, output paths, the data read and split, the unit index and the plan."""

    private_key: object
    data_key: bytes | None
    out: Path
    staging: Path | None
    table: object
    held_out: object
    unit_index: object
    plan: TrainingPlan
    note: str | None = None  # a public line for the log (an accelerate FSDP config's unapplied settings)


def _admit(contract: Contract, options: RunOptions, world, recommendation, held: _Held, private_log) -> _Admitted:
    """Every check before the run proper, on every rank behind one gate: keys, tracker, model files and output on
    rank 0, the data and its unit index everywhere, the plan on rank 0 (broadcast), the output lock (in ``held``);
    with W processes the ranks' inputs compared.

    Raises:
        BadInputError, PlanRefusedError: on any rank (every rank raises at the gate); nothing written.
    """
    main = world.is_main  # with W processes only rank 0 reads the keys, locks, charges the ledger and writes
    private_key = key = plan = None
    out, staging = outputs.output_path(contract.training.output_dir), None  # ranks other than 0 write nothing
    with distributed.gate(world):  # a refusal on any rank stops every rank here
        tracking.check_backend(contract.training.report_to)  # a missing tracker library: exit 2, nothing written
        fsdp_note = distributed.accelerate_fsdp_note(contract.training.sharding.value)
        if main:
            private_key = release_keys.load_private_key(options.signing_key)
            key = release.load_data_key(options.data_key)
            protected = protected_inputs(
                contract,
                contract_path=options.contract_path,
                signing_key=options.signing_key,
                data_key=options.data_key,
                ledger_path=options.ledger_path,
            )
            check_model_cache(contract.model)  # a packaged model's cache folder, before any conversion
            check_model_files(contract.model)  # the model folder, before the data is read or σ calibrated
            out, staging = prepare_output(contract.training, options.overwrite, protected)
        check_warm_start_file(contract.data)  # every rank's own copy, before any data is read
        if control.is_control(contract.privacy) and world.distributed:
            raise BadInputError("privacy.enabled=false (the non-private control) runs in one process only")
        unit_key, seed = contract.privacy.unit_key, contract.training.seed
        table, held_out = data_mod.load_split(contract.data, unit_key=unit_key, seed=seed)
        if options.extra_records:
            table = data_mod.append_records(table, list(options.extra_records))
        unit_index = data_mod.build_unit_index(table, contract.privacy, seed=contract.training.seed)
        if main:
            plan = plan_for(contract, unit_index, log=private_log)
            if recommendation is not None:
                plan = dataclasses.replace(plan, planner=recommendation.to_dict())
            if control.is_control(contract.privacy):  # the DP twin's N, q and T; σ = 0, ε = ∞
                plan = control.control_plan(plan)
            held.created = outputs.missing_parents(out)  # removed again if the run ends in exit 2
            held.above = outputs.FolderTimes.of(outputs.existing_parent(out))  # restored when the run ends
            held.lock = lock_output(out)
            # re-check under the lock: another run may have finished meanwhile
            prepare_output(contract.training, options.overwrite, protected)
    plan = distributed.broadcast(world, plan)  # one plan (q, T, σ, ε curve), computed on rank 0
    if world.distributed:  # every rank read the same rows in the same order, the same contract and plan
        columns = data_mod.required_columns(contract.data, contract.privacy.unit_key)
        digests = distributed.input_digests(plan, table, unit_index, columns=columns, contract_sha256=contract.sha256)
        distributed.check_same_inputs(world, digests)
    return _Admitted(
        private_key=private_key,
        data_key=key,
        out=out,
        staging=staging,
        table=table,
        held_out=held_out,
        unit_index=unit_index,
        plan=plan,
        note=fsdp_note,
    )


def _run_locked(
    contract: Contract, plan: TrainingPlan, table, unit_index, *, out: Path, staging: Path, io: RunIO, held_out=None
):
    """The run proper, holding the output lock: ledger check, model and engine, the loop, the release."""
    resumed, digest, ledger, staging = phases.open_staging(contract, plan, unit_index, out=out, staging=staging, io=io)
    spec, state = phases.set_up(
        contract, plan, table, unit_index, out=out, staging=staging, io=io, held_out=held_out, resumed=resumed
    )
    phases.log_start(spec, state, io, resumed)
    ledger = phases.reserve_charge(ledger, spec, io, resumed)
    started = resumed.meta["started_at"] if resumed is not None else io.started_at
    checkpointer = ckpt.Checkpointer(
        spec, state, started_at=started, data_digest=digest or ckpt.data_sha256(contract.data), log=io.log, last=resumed
    )
    t0, first_step = time.perf_counter(), state.step
    evaluation, train_seconds, eval_seconds = phases.train_or_fail(spec, state, io, started, checkpointer, ledger)
    timing = phases.Timing(
        seconds=time.perf_counter() - t0,
        seconds_per_step=train_seconds / max(plan.steps - first_step, 1),  # the loop alone, not the evaluation
        eval_seconds=eval_seconds,
    )
    epsilon_spent = phases.publish(spec, state, io, ledger, started=started, timing=timing)
    return RunResult(
        output_dir=out,
        release_path=out / release.RELEASE_FILENAME,
        plan=plan,
        steps_done=state.step,
        empty_steps=state.empty_steps,
        epsilon_spent=epsilon_spent,
        seconds=timing.seconds,
        seconds_per_step=timing.seconds_per_step,
        eval_seconds=timing.eval_seconds,
        threads=spec.threads,
        differentially_private=spec.mechanism.private,
        evaluation=evaluation,
        run_id=spec.run_id,
    )


def _follow(contract: Contract, plan: TrainingPlan, table, unit_index, *, out: Path, staging: None, io: RunIO):
    """A rank other than 0: the same gates, engine and steps as rank 0 on its shard; writes nothing (no staging).

    Raises:
        DploraError: this rank's failure or, through a gate or the step's reduction, another rank's.
    """
    import os

    from dplora.run.loop import run_steps

    with distributed.gate(io.world):  # rank 0 reads a resume checkpoint and checks the ledger here
        pass
    with distributed.gate(io.world):  # rank 0 also restores a resume checkpoint here
        spec, state = build_run(contract, plan, table, unit_index, out=out, staging=staging, io=io)
    distributed.sync_state(io.world, state)  # rank 0's LoRA tensors, optimizer state and step counts
    t0, first_step = time.perf_counter(), state.step
    signals = reduction.FollowerSignals(state.optimizer.reducer)
    with open(os.devnull, "w") as metrics, ProgressReporter(enabled=False) as bar, signals:
        try:
            run_steps(spec, state, metrics=metrics, progress=bar, after_step=signals.after_step)
        except Exception as err:
            if isinstance(err, DploraError):
                raise
            # this rank's own failure (the reduction re-raises it here): one line and exit 4, as on rank 0
            raise TrainingFailedError(resume.follower_failure_line(err, state, io.world.rank)) from err
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
