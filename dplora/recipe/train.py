"""One DP-LoRA run: contract → plan → data → engine → release. Called by ``dplora train``.

:func:`run_training` admits the run (every check before a byte is written: contract, signing key, data key, output
folder, data, plan, model files), compiles it once (:func:`dplora.recipe.config.compile_run`) and hands it to
:class:`DPLoRARecipe`, whose phases read in order, as torchtune's recipes do: ``setup`` (staging folder, ledger
room, model and engine, the public start lines, the ledger reservation) → ``train`` (the loop of T logical steps,
the accounting check, the held-out evaluation, the adapters and the signed release in staging) → ``release`` (the
staging folder becomes the output, the ledger is settled). Ranks other than 0 follow in
:mod:`dplora.recipe.follower`. :class:`dplora.ledger.charge.RunCharge` owns the
ledger charge's life.

The run writes into ``<output_dir>.partial`` and renames it to ``<output_dir>`` only after the last planned step,
the adapters and the signed release are written. A failed run leaves ``<output_dir>.partial`` with ``FAILED.json``
and its metrics, never a release.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from dplora.atomic import DiskFullError, save_folder, write_json, write_text
from dplora.contract.choices import ProtectedUnit, Quantization
from dplora.contract.spec import Contract
from dplora.data import units as data_mod
from dplora.engine import distributed, runtime
from dplora.engine.model import check_model_cache
from dplora.engine.schedule import step_scheduler
from dplora.errors import BadInputError, DploraError, TrainingFailedError
from dplora.ledger.charge import RunCharge
from dplora.mechanism import control, sampling
from dplora.plan.estimate import estimate_line
from dplora.plan.resolve import plan_for_run, resolve_auto
from dplora.plan.training import TrainingPlan
from dplora.recipe.build import build_run, probe_estimate
from dplora.recipe.config import RunOptions, RunResult, compile_run, protected_inputs
from dplora.recipe.follower import follow
from dplora.release import envelope as release
from dplora.release import keys as release_keys
from dplora.release import report
from dplora.release.record import unit_statement
from dplora.run import checkpoint as ckpt
from dplora.run import loop, outputs, tracking
from dplora.run import resume as resume_mod
from dplora.run.config import RunConfig
from dplora.run.execution import execution_entry, utc_now
from dplora.run.loop import METRICS_HEADER, RunSpec, RunState, sharded_base
from dplora.run.progress import BatchReporter, ProgressReporter
from dplora.signals import HeldSignals
from dplora.surface import PrivateLog

if TYPE_CHECKING:
    import datasets
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from dplora.evaluate.heldout import Evaluation


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunIO:
    """What one run holds besides its config: the caller's options and what the run resolved from them.

    Attributes:
        options: the caller's :class:`dplora.recipe.config.RunOptions` (unchanged).
        data_key: the data owner's HMAC key bytes, or None.
        log: the public log (rank 0's; other ranks print nothing).
        progress: progress reports on (``options.progress`` on rank 0 only).
        private: the run's private diagnostics (never on the public log).
        started_at: UTC, taken before the data is read: the only time a release records.
    """

    options: RunOptions
    data_key: bytes | None
    log: Callable[[str], None]
    progress: bool
    private: PrivateLog
    started_at: str


def quiet_log(message: str) -> None:
    """The log of ranks other than 0: rank 0 reports for the run."""


def run_training(contract: Contract, options: RunOptions | None = None, *, log=print, private_log=None) -> RunResult:
    """Train DP-LoRA adapters under ``contract`` and write them with a signed release record.

    Args:
        contract: the validated contract (overrides applied).
        options: keys, ledger and output policy, threads, progress (:class:`dplora.recipe.config.RunOptions`;
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
        config = compile_run(contract, admitted.plan, options, world)
        io = RunIO(
            options=options,
            data_key=admitted.data_key,
            progress=options.progress and world.is_main,
            log=log if world.is_main else quiet_log,
            private=private_log if world.is_main else PrivateLog(),
            started_at=started_at,
        )
        if admitted.note:  # a launcher's FSDP settings that dplora does not apply (public: env and contract only)
            io.log(admitted.note)
        if not world.is_main:
            return follow(config, contract.data, admitted.table, admitted.unit_index, out=admitted.out, io=io)
        return DPLoRARecipe(contract, config, admitted, io).run()
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

    lock: IO[str] | None = None
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
class Admitted:
    """A run past its checks: keys, output paths, the data read and split, the unit index and the plan.

    ``private_key`` (the loaded Ed25519 signing key) and ``staging`` are rank 0's; None elsewhere."""

    private_key: Ed25519PrivateKey | None
    data_key: bytes | None
    out: Path
    staging: Path | None
    table: datasets.Dataset
    held_out: datasets.Dataset | None
    unit_index: data_mod.UnitIndex
    plan: TrainingPlan
    note: str | None = None  # a public line for the log (an accelerate FSDP config's unapplied settings)


def _admit(contract: Contract, options: RunOptions, world, recommendation, held: _Held, private_log) -> Admitted:
    """Every check before the run proper, on every rank behind one gate: keys, tracker, model files and output on
    rank 0, the data and its unit index everywhere, the plan on rank 0 (broadcast), the output lock (in ``held``);
    with W processes the ranks' inputs compared.

    Raises:
        BadInputError, PlanRefusedError: on any rank (every rank raises at the gate); nothing written.
    """
    from dplora.data.precheck import check_warm_start_file
    from dplora.engine.precheck import check_model_files

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
            out, staging = outputs.prepare_output(contract.training.output_dir, options.overwrite, protected)
        check_warm_start_file(contract.data)  # every rank's own copy, before any data is read
        if not contract.privacy.enabled and world.distributed:
            raise BadInputError("privacy.enabled=false (the non-private control) runs in one process only")
        unit_key, seed = contract.privacy.unit_key, contract.training.seed
        table, held_out = data_mod.load_split(contract.data, unit_key=unit_key, seed=seed)
        if options.extra_records:
            table = data_mod.append_records(table, list(options.extra_records))
        unit_index = data_mod.build_unit_index(table, contract.privacy, seed=contract.training.seed)
        if main:
            plan = plan_for_run(contract, unit_index, recommendation=recommendation, log=private_log)
            held.created = outputs.missing_parents(out)  # removed again if the run ends in exit 2
            held.above = outputs.FolderTimes.of(outputs.existing_parent(out))  # restored when the run ends
            held.lock = outputs.lock_output(out)
            # re-check under the lock: another run may have finished meanwhile
            outputs.prepare_output(contract.training.output_dir, options.overwrite, protected)
    plan = distributed.broadcast(world, plan)  # one plan (q, T, σ, ε curve), computed on rank 0
    if world.distributed:  # every rank read the same rows in the same order, the same contract and plan
        columns = data_mod.required_columns(contract.data, contract.privacy.unit_key)
        digests_ = distributed.input_digests(plan, table, unit_index, columns=columns, contract_sha256=contract.sha256)
        distributed.check_same_inputs(world, digests_)
    return Admitted(
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


class DPLoRARecipe:
    """The training run on rank 0, holding the output lock: :meth:`setup` → :meth:`train` → :meth:`release`.

    Each phase cleans up after itself on failure as the run requires: bad input writes nothing, a setup failure
    leaves FAILED.json, a training failure settles the ledger for the steps taken (:meth:`_record_failure`).
    """

    def __init__(self, contract: Contract, config: RunConfig, admitted: Admitted, io: RunIO):
        self.contract, self.config, self.admitted, self.io = contract, config, admitted, io
        self.charge = RunCharge(
            contract.privacy,
            config,
            output_dir=contract.training.output_dir,
            ledger_path=io.options.ledger_path,
            overwrite=io.options.overwrite,
            non_private=io.options.non_private,
            tuning_trial=io.options.tuning_trial,
            ledger_release=io.options.ledger_release,
        )
        self.spec: RunSpec | None = None
        self.state: RunState | None = None
        self.resumed: ckpt.CheckpointInfo | None = None
        self.checkpointer: ckpt.Checkpointer | None = None
        self.started = io.started_at
        self.facts: report.PublicFacts | None = None

    def run(self) -> RunResult:
        """Set up, train and release. Raises: as :func:`run_training`."""
        self.setup()
        t0, first_step = time.perf_counter(), self.state.step
        evaluation, train_seconds, eval_seconds = self.train()
        seconds = time.perf_counter() - t0
        per_step = train_seconds / max(self.config.plan.steps - first_step, 1)  # the loop alone, not the evaluation
        # SIGTERM/SIGINT while the signed release moves into place is held until it is in place: a half-published
        # run helps no one, and a stop there would be told apart from one before the last step
        with HeldSignals() as held:
            result = self.release(evaluation, seconds=seconds, seconds_per_step=per_step, eval_seconds=eval_seconds)
        if held.signal_name is not None:
            self.io.log(f"{held.signal_name} arrived while the finished run was published: the release is complete")
        return result

    # --- setup -------------------------------------------------------------------------------------------------

    def setup(self) -> None:
        """Staging folder and ledger room, model and engine (restored on resume), public start lines, reservation.

        Raises:
            BadInputError, PlanRefusedError, LedgerError: nothing written (a fresh run's staging is removed).
            TrainingFailedError: a setup stage failed (FAILED.json, stage ``setup``).
        """
        digest, staging = self._open_staging()
        self._build(staging)
        self._log_start()
        spec = self.spec
        try:
            self.charge.reserve(spec.run_id, resumed=self.resumed is not None, checkpoint_dir=spec.staging)
        except BaseException:
            if self.resumed is None:  # lost the race for the cap (or any refusal): leave nothing, not even .partial
                shutil.rmtree(spec.staging, ignore_errors=True)
            raise
        self.started = self.resumed.meta["started_at"] if self.resumed is not None else self.io.started_at
        self.checkpointer = ckpt.Checkpointer(
            spec,
            self.state,
            started_at=self.started,
            data_digest=digest or ckpt.data_sha256(self.contract.data),
            log=self.io.log,
            last=self.resumed,
        )

    def _open_staging(self) -> tuple[str | None, Path]:
        """Behind one gate: the resume point (with ``--resume``), the ledger with room for the plan, the staging
        folder ``<out>.partial`` and the private log's folder. Returns (the checkpoint's data digest or None, the
        staging path). Raises: BadInputError, PlanRefusedError, LedgerError: nothing written."""
        io, config, admitted = self.io, self.config, self.admitted
        with distributed.gate(config.world):  # ranks other than 0 pass the same gate (dplora.recipe.follower)
            resumed, digest = (
                resume_mod.resume_point(
                    admitted.staging, config.contract_yaml, self.contract.data, config.plan, admitted.unit_index
                )
                if io.options.resume
                else (None, None)
            )
            self.resumed = resumed
            self.charge.open(resumed and resumed.run_id)
            staging = resume_mod.prepare_staging(
                admitted.out,
                resuming=resumed is not None,
                overwrite=io.options.overwrite,
                on_discard=lambda info, ran: self.charge.settle_discarded(info, ran=ran, log=io.log),
                log=io.log,
            )
            io.private.attach(outputs.private_staging(staging))  # private diagnostics from here on
        return digest, staging

    def _build(self, staging: Path) -> None:
        """(RunSpec, RunState) built (and restored from the resume checkpoint), then synchronised across ranks.

        On failure: bad input removes the staging folder (nothing written); any other failure before step 0 work
        leaves FAILED.json (stage ``setup``), which the next run replaces. Raises: whatever the setup raised.
        """
        resumed, io = self.resumed, self.io
        try:
            with distributed.gate(self.config.world):
                spec, state = build_run(
                    self.config,
                    self.contract.data,
                    self.admitted.table,
                    self.admitted.unit_index,
                    out=self.admitted.out,
                    staging=staging,
                    log=io.log,
                    private=io.private,
                    held_out=self.admitted.held_out,
                    warm=not io.options.resume,
                )
                if resumed is not None:  # same run id: the ledger charge is the original reservation
                    # the public warm start ran before the checkpoint's first step: its adapters and entry are there
                    spec = dataclasses.replace(spec, run_id=resumed.run_id, warm_start=resumed.meta.get("warm_start"))
                    ckpt.restore(spec, state, resumed)
                    if state.scheduler is not None:  # the schedule is a function of the step: fast-forward it
                        step_scheduler(state.scheduler, state.step)
            distributed.sync_state(self.config.world, state)  # every rank starts from rank 0's tensors and counts
        except BaseException as err:
            if getattr(err, "exit_code", None) == 2 and resumed is None:  # bad input: nothing written
                shutil.rmtree(staging, ignore_errors=True)
            elif resumed is None:  # before step 0 work and before the ledger charge: the next run replaces it
                entry = resume_mod.setup_failure_entry(err, self.config.plan.steps)
                try:  # whole or not at all; a full disk must not hide the original error
                    write_json(staging / "FAILED.json", entry)
                except (OSError, DiskFullError):
                    pass
            raise
        self.spec, self.state = spec, state

    def _log_start(self) -> None:
        """The public lines before step 1: the resume note, the plan's warnings, the unit note, the device and
        mechanism line, the control's warning, the distributed line and the time estimate. Public: a function of
        the contract, the plan and the probe on synthetic batches only."""
        spec, io, config = self.spec, self.io, self.config
        log, plan, world = io.log, config.plan, config.world
        if self.resumed is not None:
            # the step it resumes from is where a signal or a failure stopped it: wall-clock time and the realised
            # batches decided it, so it stays in the private checkpoint
            log(f"resuming run {spec.run_id} from its checkpoint; noise and sampling reseeded from OS entropy")
            note = distributed.resume_note(self.resumed.meta.get("execution", {}), world)
            if note:
                log(note)
        for warning in plan.warnings:  # once the run is set up: bad input (exit 2) prints its one error line only
            log(f"warning: {warning}")
        if config.protected_unit is ProtectedUnit.TICKET:
            log(f"note: ticket-level DP {unit_statement(ProtectedUnit.TICKET)}")
        mechanism = (
            f"σ={plan.noise_multiplier:.4f}, ε={plan.epsilon:.4f} ({plan.accountant.value})"
            if spec.mechanism.private
            else "no clipping, no noise, no accountant (non-private control)"
        )
        quantized = Quantization(config.model.quantization) is not Quantization.NONE
        base = f"NF4 4-bit base, {spec.dtype} compute" if quantized else f"{spec.dtype} base"
        log(
            f"device: {spec.device} ({base}, fp32 LoRA), threads: {spec.threads}; N={plan.num_units} units, "
            f"q={plan.sample_rate:.4g}, T={plan.steps}, {mechanism}"
        )
        if not spec.mechanism.private:
            log(f"warning: {control.NO_DP_STATEMENT}")
        if world.distributed:
            low, high = sampling.expected_units_per_rank(plan.sample_rate, plan.num_units, world.world_size)
            log(
                f"distributed: {world.world_size} processes ({world.launcher}, {world.backend}); units sharded "
                f"by rank, expected {low:.4g}–{high:.4g} units per rank per step; noise drawn once per step on rank 0"
            )
        self._log_estimate()

    def _log_estimate(self) -> None:
        """Time one synthetic step and print the public estimate before step 1 (:mod:`dplora.plan.estimate`).

        Its inputs are the plan's public numbers, public contract keys and the probe's time: never the data."""
        spec, state, log = self.spec, self.state, self.io.log
        if sharded_base(spec) and spec.world.distributed:  # rank 0 cannot forward alone
            log(
                "estimate: not probed under training.sharding: fsdp with several processes (every forward is "
                "collective)"
            )
            return
        inputs = probe_estimate(
            self.contract,
            spec.plan,
            state.model,
            state.optimizer,
            state.named,
            pad_id=spec.pad_id,
            physical=spec.physical_batch_size,
            world_size=spec.world.world_size,
            done_steps=0,  # the whole plan, also when resuming: the steps already done are not public
        )
        if inputs is None:
            log("estimate: none (the synthetic probe batch did not fit in accelerator memory)")
        elif inputs.steps > 0:
            log(estimate_line(inputs))

    # --- train -------------------------------------------------------------------------------------------------

    def train(self) -> tuple[Evaluation | None, float, float]:
        """The loop, the accounting check, the held-out evaluation and the signed release in staging.

        Returns:
            (evaluation or None, wall seconds of the loop alone, of the held-out evaluation alone).

        Raises:
            KeyboardInterrupt: SIGINT/SIGTERM, one line naming FAILED.json and the resume hint.
            TrainingFailedError: any failure in training (one line); DploraError subclasses that are bad input
                pass through. The failure is recorded first (FAILED.json, the ledger charge for the steps taken).
        """
        spec, state, checkpointer = self.spec, self.state, self.checkpointer
        try:
            return self._train_and_sign()
        except BaseException as err:
            if isinstance(err, KeyboardInterrupt) and not checkpointer.stopping:
                # a signal after the last step (held-out evaluation, signing), past the checkpointer's handler: the
                # same line as a stop before it, so the log does not tell k = T from k < T
                signal_name = str(err.args[0]) if err.args else "SIGINT"
                self.io.log(ckpt.stop_line(signal_name))
            self._record_failure(err)
            if isinstance(err, KeyboardInterrupt):
                name = str(err.args[0]) if err.args else "Ctrl-C"
                hint = resume_mod.resume_hint(spec, checkpointer.last)
                failed = spec.staging / "FAILED.json"
                raise KeyboardInterrupt(f"interrupted ({name}); no release was written; see {failed}; {hint}") from None
            if isinstance(err, DploraError) and not isinstance(err, TrainingFailedError | DiskFullError):
                raise
            raise TrainingFailedError(resume_mod.failure_line(err, spec, state, checkpointer.last)) from err

    def _train_and_sign(self) -> tuple[Evaluation | None, float, float]:
        spec, state, checkpointer = self.spec, self.state, self.checkpointer
        tracker = tracking.tracker_for(spec, self.started)
        header = dict(METRICS_HEADER)
        if not spec.mechanism.private:  # the control's metrics say it carries no DP guarantee
            header["non_private"] = control.NO_DP_STATEMENT
        completed = False  # every planned step taken and accounted: only then does the tracker keep public numbers
        try:
            with (
                outputs.open_metrics(spec.staging, state.step, header) as metrics,
                ProgressReporter(enabled=self.io.progress, callback=self.io.options.on_progress) as bar,
                checkpointer,
            ):
                bar.start(spec.plan.steps, done=state.step, epsilon_at=spec.plan.epsilon_at)
                checkpointer.write()  # before step 1 (skipped when resuming from this step)
                logged = metrics if tracker is None else tracking.TrackedMetrics(metrics, tracker)
                runtime.reset_peak_memory(spec.device)  # the peak reported is the steps', not the probe's (set-up)
                t0 = time.perf_counter()
                hook = ckpt.after_step_hook(state, checkpointer)
                ckpt.fault_point("loop-start", state.step)  # test seam (dplora.run.checkpoint.fault_hook)
                loop.run_steps(spec, state, metrics=logged, progress=bar, after_step=hook)
                ckpt.fault_point("loop-end", state.step)
                train_seconds = time.perf_counter() - t0
            ranks = loop.check_accounted(spec, state)
            completed = True
            t0 = time.perf_counter()
            evaluation = self._evaluate_held_out()
            eval_seconds = time.perf_counter() - t0 if evaluation is not None else 0.0
            if tracker is not None and evaluation is not None and not evaluation.public:
                tracker.log_private(tracking.eval_scalars(evaluation), step=state.step)
        finally:
            if tracker is not None:
                tracker.close(completed=completed)
        self._write_release(ranks, evaluation)
        return evaluation, train_seconds, eval_seconds

    def _evaluate_held_out(self) -> Evaluation | None:
        """Base vs adapters on the held-out set (None without one); logs the numbers labelled, never held-out text.

        Private held-out numbers go to the private ``metrics.jsonl`` under ``not_covered_by_dp`` only, never into
        the release folder; they enter the record only when the set is declared public. With W processes rank 0
        evaluates alone, after the last step.
        """
        import json

        from dplora.atomic import append_line

        spec, state, io = self.spec, self.state, self.io
        if spec.held_out is None:
            return None
        if sharded_base(spec) and spec.world.distributed:  # rank 0 cannot forward alone
            io.log(
                "held-out evaluation: skipped under training.sharding: fsdp with several processes (every forward "
                f"is collective); run `dplora eval {spec.out}` on the release"
            )
            return None
        from dplora.engine.perexample import unwrap
        from dplora.evaluate.heldout import evaluate_model, held_out_source
        from dplora.evaluate.report import report_lines

        data = self.contract.data
        source, public = held_out_source(data)
        with BatchReporter("held-out eval", enabled=io.progress, public=public) as progress:  # operator's terminal
            evaluation = evaluate_model(
                unwrap(state.model),
                spec.tokenizer,
                spec.held_out,
                data,
                self.config,
                device=spec.device,
                source=source,
                public=public,
                private_run=spec.mechanism.private,
                progress=progress,
            )
        for line in report_lines(evaluation):  # numbers on a private held-out set are private diagnostics
            (io.log if public else io.private)(line)
        with outputs.metrics_path(spec.staging).open("a") as metrics:
            entry = {"eval": evaluation.to_dict()}
            append_line(metrics, json.dumps(entry if public else {"not_covered_by_dp": entry}))
        return evaluation

    def _write_release(self, ranks, evaluation: Evaluation | None) -> None:
        """Save the adapters and the resolved contract, then sign the record of the run's public facts (inside
        staging). A held-out evaluation enters the record only when its set is declared public."""
        from dplora.engine.basefiles import base_model_entry
        from dplora.engine.lora import adapted_module_names
        from dplora.engine.perexample import unwrap

        spec, state, io = self.spec, self.state, self.io
        staging = spec.staging.resolve()
        adapters = unwrap(state.model)
        save_folder(staging / "adapter", adapters.save_pretrained)
        write_text(staging / "contract.yaml", self.config.contract_yaml)
        self.facts = report.PublicFacts(
            contract=self.contract,
            plan=spec.plan,
            run_id=spec.run_id,
            steps_done=state.step,
            epsilon_spent=spec.plan.epsilon_at(state.step),
            private=spec.mechanism.private,
            started_at=self.started,  # before the data was read: the record's only time
            data_digest=release.data_digest_entry([Path(self.contract.data.path)], io.data_key),
            base_model=base_model_entry(self.config.model, io.log, dtype=spec.dtype),
            execution=execution_entry(spec, reducer=getattr(state.optimizer, "reducer", None), ranks=ranks),
            lora_targets=adapted_module_names(adapters),  # what auto / all-linear resolved to
            tokenization=spec.tokenization,
            warm_start=spec.warm_start,  # by name and sha256, no machine path
            evaluation=evaluation.to_dict() if evaluation is not None and evaluation.public else None,
        )
        report.sign(self.facts, staging, private_key=self.admitted.private_key)

    def _record_failure(self, err: BaseException) -> None:
        """FAILED.json (public: stage, planned T, reserved ε, the reason without the step reached) and its private
        twin (steps done, ε after them, the time); never a release. The ledger charge stays pending while a resume
        checkpoint keeps the run resumable; a run that failed before its first checkpoint took no step (ε 0).
        """
        spec, state, last = self.spec, self.state, self.checkpointer.last
        public, private = resume_mod.failure_entries(spec, state, err, last)
        try:  # whole or not at all (dplora.atomic); the private twin first, where the public one points
            write_json(outputs.private_staging(spec.staging) / outputs.FAILED_FILENAME, private)
            write_json(spec.staging / outputs.FAILED_FILENAME, public)
            # their mtimes would be the failure time: the record's start instead (the private twin keeps the time)
            outputs.stamp(spec.staging / outputs.FAILED_FILENAME, self.started)
            outputs.stamp(spec.staging, self.started)
        except (OSError, DiskFullError):  # a full disk must not hide the original error
            pass
        (spec.staging / release.RELEASE_FILENAME).unlink(missing_ok=True)
        self.charge.fail(spec.plan.epsilon_spent(state.accountant.steps), resumable=last is not None)

    # --- release -----------------------------------------------------------------------------------------------

    def release(self, evaluation, *, seconds: float, seconds_per_step: float, eval_seconds: float) -> RunResult:
        """Move the staging folder to the output (fixed mtimes), write the private diagnostics, settle the ledger
        and record the release. ε spent is the plan's curve at the steps taken (integer T)."""
        spec, state, io, out = self.spec, self.state, self.io, self.admitted.out
        epsilon_spent = spec.plan.epsilon_at(state.step)
        peak = runtime.peak_memory_gib(spec.device)  # private: activations grow with the realised (private) batch
        io.private(f"peak memory: {peak:.2f} GiB ({runtime.memory_kind(spec.device)})")
        ckpt.discard(spec.staging)  # a resume checkpoint never leaves the partial folder
        kept = outputs.publish(spec.staging, out)
        outputs.fix_mtimes(out, self.started)  # released files carry the record's start time, never the run's end
        outputs.fix_mtimes(tracking.tracking_path(out), self.started)
        io.private.attach(outputs.private_path(out))
        if state.records_zeroed:
            io.private(
                f"{state.records_zeroed} record(s) had a non-finite loss or gradient (an overflow) and contributed "
                "zero; their units were still counted, clipped and noised as usual"
            )
        io.private.put(
            run_id=spec.run_id,
            seconds=round(seconds, 3),
            seconds_per_step=round(seconds_per_step, 3),
            eval_seconds=round(eval_seconds, 3),
            empty_steps=state.empty_steps,
            records_zeroed=state.records_zeroed,
            peak_memory_gib=round(peak, 3),
            note="private diagnostics, computed on the private data and NOT covered by DP: never publish",
        )
        if kept is not None:
            io.log(f"warning: files appeared in {out} during the run; the old folder was kept as {kept}")
        self.charge.settle(epsilon_spent, record=out / release.RELEASE_FILENAME)
        return RunResult(
            output_dir=out,
            release_path=out / release.RELEASE_FILENAME,
            plan=spec.plan,
            steps_done=state.step,
            empty_steps=state.empty_steps,
            epsilon_spent=epsilon_spent,
            seconds=seconds,
            seconds_per_step=seconds_per_step,
            eval_seconds=eval_seconds,
            threads=spec.threads,
            differentially_private=spec.mechanism.private,
            evaluation=evaluation,
            run_id=spec.run_id,
            summary=report.train_summary(self.facts, out, threads=spec.threads),
        )
