"""One DP-LoRA run: contract → plan → data → engine → release. Called by ``dplora train``.

Everything that can be checked is checked before a byte is written: contract, signing key, data key,
output folder, data, plan, model, LoRA targets, per-sample gradients. The run writes into
``<output_dir>.partial`` and renames it to ``<output_dir>`` only after the last planned step, the adapters
and the signed release are written. A failed run leaves ``<output_dir>.partial`` with ``FAILED.json`` and its
metrics, never a release.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
import uuid
import warnings
from pathlib import Path

from dplora.accounting import Adjacency
from dplora.contract.spec import Contract, ProtectedUnit, UnitClipping
from dplora.data import units as data_mod
from dplora.engine import control, distributed
from dplora.errors import BadInputError, DploraError, PlanRefusedError, TrainingFailedError, excerpt
from dplora.plan.training import TrainingPlan, ledger_event, make_plan
from dplora.recipe.inputs import protected_inputs
from dplora.release import envelope as release
from dplora.release.record import build_record, non_private_record, unit_statement
from dplora.run import outputs
from dplora.run.execution import execution_entry, utc_now


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunResult:
    """What a finished run produced (seconds are wall-clock); ``release_path`` is None on ranks other than 0."""

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
    run_id: str = ""


def plan_for(
    contract: Contract, unit_index: data_mod.UnitIndex | None, *, release: bool = True, log=None
) -> TrainingPlan:
    """Plan with a public N: ``privacy.num_units`` if declared, else (where N is public) the data's count.

    N is private under add/remove adjacency: the neighbouring dataset has one unit more or less, so a counted N
    (and the q = B/N, T = ⌈E·N/B⌉ and σ that follow from it) would tell the neighbours apart. A run that writes a
    release (``release``) must then declare N as a public number; the data's count is only compared with it, as
    a local warning through ``log`` (refusing would make "release or no release" depend on one unit). Under
    replace-one adjacency N is public (neighbours hold the same number of units) unless ``data.eval_fraction``
    can move the replaced unit across the held-out split; then N must be declared too. ``release=False``
    (``dplora budget``, a local dry run) plans with the exact count and never refuses for want of a declared N.

    Args:
        contract: the validated contract.
        unit_index: the training side's units (None: no data read; N must be declared).
        release: the plan feeds a release (record, card, manifest): N must be public.
        log: one-line local message sink for the count check (never written into a release).
    Returns:
        :class:`dplora.plan.training.TrainingPlan`; ``num_units_source`` is ``"contract"`` or ``"data"`` (public count).
    Raises:
        BadInputError: N not declared where it is private, or not declared and no data given (exit 2).
        PlanRefusedError: see :func:`dplora.plan.training.make_plan`.
    """
    declared = contract.privacy.num_units
    if declared is not None:
        if unit_index is not None and unit_index.num_units > declared and log is not None:
            log(
                f"warning: the data holds more protected units than privacy.num_units={declared} (local check, "
                "not written into the release); q, T and σ use the declared N"
            )
        return make_plan(contract, num_units=declared, num_units_source="contract")
    if unit_index is None:
        raise BadInputError("privacy.num_units is not declared: the data is needed to count protected units")
    why = private_count_reason(contract)
    if why is not None and release:
        raise BadInputError(
            f"privacy.num_units: declare N as a public number ({why}; the data has about "
            f"{_rounded(unit_index.num_units)} units: do not copy the exact count if it is private, round it)"
        )
    return make_plan(contract, num_units=unit_index.num_units, num_units_source="data")


def private_count_reason(contract: Contract) -> str | None:
    """Why the data's count of units is private under ``contract`` (None: it is public).

    Add/remove: neighbouring datasets differ in N. Replace-one with ``data.eval_fraction``: the keyed split can
    put the replaced unit on the other side, so the training side's N differs by one.
    """
    privacy = contract.privacy
    if privacy.adjacency is Adjacency.ADD_REMOVE:
        return "under add_remove adjacency the counted N differs between neighbouring datasets"
    if contract.data.eval_fraction is not None:
        return "under replace_one, data.eval_fraction can move the replaced unit out of the training side"
    return None


def _rounded(n: int) -> int:
    """``n`` to two significant figures (a hint for the operator's error line, not a count to copy)."""
    digits = max(len(str(n)) - 2, 1)  # at least to tens: below 100 two figures would be the exact count
    return int(round(n, -digits))


def _prepare_output(contract: Contract, overwrite: bool, protected=()) -> tuple[Path, Path]:
    """The output folder and its ``.partial`` sibling; refusals follow :func:`dplora.run.outputs.check_output_dir`."""
    try:
        out = outputs.check_output_dir(contract.training.output_dir, overwrite=overwrite, protected=protected)
    except OSError as err:  # a name too long for the file system, a permission denied on a parent
        where = f"training.output_dir={excerpt(contract.training.output_dir, 200)}"
        raise BadInputError(f"{where}: {err.strerror or err.__class__.__name__}") from None
    return out, outputs.staging_path(out)


def _lock_output(out: Path):
    """Hold an exclusive lock on ``<output_dir>.lock`` for the run (released when the process ends).

    Raises:
        BadInputError: another run is writing to the same output folder.
    """
    import fcntl

    lock_path = outputs.lock_path(out)
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a")  # noqa: SIM115 - held open for the whole run
    except OSError as err:
        raise BadInputError(f"cannot create {lock_path}: {err.strerror}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise BadInputError(
            f"another dplora train is writing to {out}; wait for it or choose another output_dir"
        ) from None
    return handle


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _setup_model(contract: Contract, device, dtype: str, allow_tf32: bool, log):
    """Load the base model in ``dtype`` on ``device``, then wrap it with fp32 LoRA adapters (peft)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from dplora.engine.model import load_model_and_tokenizer, place_model

    model, tokenizer = load_model_and_tokenizer(contract.model, log)
    model = place_model(model, device, dtype, allow_tf32)  # on its device BEFORE get_peft_model (cases T1)
    lora = contract.lora
    torch.manual_seed(contract.training.seed)  # the recorded seed: LoRA initialisation only
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        peft_model = get_peft_model(model, config, autocast_adapter_dtype=True)  # LoRA tensors in fp32
    except ValueError as err:
        raise BadInputError(f"lora.target_modules={list(lora.target_modules)}: {str(err).splitlines()[0]}") from None
    for _, p in peft_model.named_parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
    torch.seed()  # everything random from here on (dropout) draws from OS entropy, not the recorded seed
    peft_model.train()
    return peft_model, tokenizer


def _make_optimizer(contract: Contract, params):
    import torch

    lr = contract.training.lr
    name = contract.training.optimizer.value
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


def run_training(
    contract: Contract,
    *,
    signing_key: Path | None,
    data_key: Path | None,
    overwrite: bool = False,
    ledger_path: Path | None = None,
    threads: int | None = None,
    progress: bool = True,
    tuning_trial: bool = False,
    non_private: bool = False,
    contract_path: Path | None = None,
    resume: bool = False,
    log=print,
    extra_records: list[dict] | None = None,
    ledger_release: bool = True,
) -> RunResult:
    """Train DP-LoRA adapters under ``contract`` and write them with a signed release record.

    Args:
        contract: the validated contract (overrides applied).
        signing_key: Ed25519 private key PEM (else ``$DPLORA_SIGNING_KEY``).
        data_key: the data owner's HMAC key file (else ``$DPLORA_DATA_KEY``; else no data digest).
        overwrite: replace a non-empty output folder (only after the new run succeeded).
        ledger_path: SQLite budget ledger (used when ``privacy.population`` is set).
        threads: CPU threads (default: free cores).
        progress: report progress on stderr (a bar on a terminal, plain lines otherwise; see dplora.run.progress).
        tuning_trial: charge the ledger as a hyperparameter-tuning trial (it counts like any release).
        non_private: allow a ``privacy.enabled: false`` control on a ledger population (charged ε = ∞).
        contract_path: the contract file, which the output folder must not hold.
        resume: continue from the resume checkpoint in ``<output_dir>.partial`` (same contract and data).
        log: one-line message sink.
        extra_records: rows appended to the training table after the held-out split (the audit's canaries,
            each its own protected unit); every column of the data file, text values.
        ledger_release: record the signed release in the ledger (False: a ``dplora sweep`` trial, signed with a
            throw-away key and not a release; the sweep records the one release it makes). The charge is the same.

    Returns:
        :class:`RunResult`.

    Raises:
        BadInputError, PlanRefusedError: before anything is written (exit 2); with ``resume``, also no
            checkpoint or a changed contract, data or plan.
        TrainingFailedError: a sanity check, a non-finite loss, out of memory, a full disk (exit 4); no release
            is written, the last resume checkpoint and FAILED.json stay.
        KeyboardInterrupt: SIGINT/SIGTERM; a resume checkpoint of the last finished step is written first.
    """
    world = distributed.init_world()  # one process unless started by torchrun / accelerate launch
    main = world.is_main  # with W processes only rank 0 reads the keys, locks, charges the ledger and writes
    lock = private_key = key = plan = None
    created: list[Path] = []  # folders above the output that this run creates
    bad_input = False
    out, staging = outputs.output_path(contract.training.output_dir), None  # ranks other than 0 write nothing
    try:
        with distributed.gate(world):  # a refusal on any rank stops every rank here
            if main:
                private_key = release.load_private_key(signing_key)
                key = release.load_data_key(data_key)
                protected = protected_inputs(
                    contract,
                    contract_path=contract_path,
                    signing_key=signing_key,
                    data_key=data_key,
                    ledger_path=ledger_path,
                )
                out, staging = _prepare_output(contract, overwrite, protected)
            if control.is_control(contract) and world.distributed:
                raise BadInputError("privacy.enabled=false (the non-private control) runs in one process only")
            table, held_out = data_mod.split_eval(data_mod.load_table(contract), contract)
            if extra_records:
                table = data_mod.append_records(table, extra_records)
            unit_index = data_mod.build_unit_index(table, contract.privacy, seed=contract.training.seed)
            if main:
                plan = plan_for(contract, unit_index, log=log)
                if control.is_control(contract):  # the DP twin's N, q and T; σ = 0, ε = ∞
                    plan = control.control_plan(plan)
                created = outputs.missing_parents(out)  # removed again if the run ends in exit 2
                lock = _lock_output(out)
                # re-check under the lock: another run may have finished meanwhile
                _prepare_output(contract, overwrite, protected)
        plan = distributed.broadcast(world, plan)  # one plan (q, T, σ, ε curve), computed on rank 0
        if world.distributed:  # every rank read the same rows in the same order, the same contract and plan
            distributed.check_same_inputs(world, distributed.input_digests(contract, plan, table, unit_index))
        io = _RunIO(
            private_key=private_key,
            data_key=key,
            ledger_path=ledger_path,
            threads=threads,
            progress=progress and main,
            tuning_trial=tuning_trial,
            non_private=non_private,
            log=log if main else _quiet,
            overwrite=overwrite,
            resume=resume,
            world=world,
            ledger_release=ledger_release,
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
        distributed.finish(world)


def _quiet(message: str) -> None:
    """The log of ranks other than 0: rank 0 reports for the run."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class _RunIO:
    """The run's inputs that are not the contract: keys, ledger, threads and how to report."""

    private_key: object
    data_key: bytes | None
    ledger_path: Path | None
    threads: int | None
    progress: bool
    tuning_trial: bool
    log: object
    overwrite: bool = False
    resume: bool = False
    world: distributed.World = distributed.SINGLE
    non_private: bool = False
    ledger_release: bool = True


class _Stage:
    """Turn an unexpected exception in a setup stage into a one-line TrainingFailedError naming the stage."""

    def __init__(self, what: str, device):
        self.what, self.device = what, device

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if err is None or isinstance(err, DploraError) or not isinstance(err, Exception):
            return False
        detail = (str(err).strip().splitlines() or [""])[0][:160]
        raise TrainingFailedError(
            f"{self.what} failed on {self.device}: {err.__class__.__name__}" + (f": {detail}" if detail else "")
        ) from err


def _open_ledger(contract: Contract, plan: TrainingPlan, io: _RunIO, resumed_run: str | None = None):
    """The ledger with room for the plan; a resumed run instead needs its own charge still pending."""
    if not contract.privacy.population:
        return None
    from dplora.ledger.store import Ledger, default_ledger_path

    if control.is_control(contract) and not io.non_private:
        pop = contract.privacy.population
        raise PlanRefusedError(
            f"privacy.enabled=false on population {pop!r}: a non-private run is charged ε=∞ in the ledger, over "
            f"any cap, and every later DP run on {pop!r} is then refused; pass --non-private to run it anyway"
        )
    ledger = Ledger(io.ledger_path or default_ledger_path(), create=False)  # a missing ledger fails closed
    if resumed_run is None and not control.is_control(contract):
        ledger.check(
            contract.privacy.population,
            epsilon=plan.epsilon,
            delta=plan.delta,
            protected_unit=contract.privacy.protected_unit.value,
            adjacency=plan.adjacency.value,
            events=[ledger_event(plan)],
        )
    elif resumed_run is not None:
        try:
            status = ledger.charge(resumed_run).status
        except BadInputError:
            raise BadInputError(
                f"--resume: run {resumed_run} has no charge in ledger {ledger.path}: pass the ledger it was charged in"
            ) from None
        if status != "pending":
            raise BadInputError(f"--resume: run {resumed_run} is already {status} in ledger {ledger.path}: start anew")
    return ledger


def _build(
    contract: Contract, plan: TrainingPlan, table, unit_index, *, out: Path, staging: Path, io: _RunIO, held_out=None
):
    """Model, tokens and the private engine on the chosen device: (RunSpec, RunState). Writes nothing."""
    import torch

    from dplora.engine import step as engine
    from dplora.engine.model import resolve_precision, select_device
    from dplora.run.loop import RunSpec, RunState

    # Opacus hooks on a frozen base: inputs need no grad, which is expected here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
    # W processes on one node share its free cores
    n_threads = io.threads or contract.training.threads or max(1, engine.free_threads() // io.world.local_world_size)
    torch.set_num_threads(n_threads)
    device = select_device()
    dtype, allow_tf32 = resolve_precision(contract.model, device)
    with _Stage("loading the model", device):
        model, tokenizer = _setup_model(contract, device, dtype, allow_tf32, io.log)
    examples = data_mod.tokenize_records(table, tokenizer, contract)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if io.world.distributed:  # the same weights, tokenizer, tokens, LoRA init and library versions on every rank
        from dplora.engine.model import base_model_entry

        entry = base_model_entry(contract.model, io.log)
        distributed.check_same_inputs(io.world, distributed.model_digests(entry, examples, named))
    if held_out is not None:  # before training, not after it
        from dplora.evaluate.heldout import check_held_out

        check_held_out(held_out, tokenizer, contract)
    if not named:
        raise BadInputError("no trainable parameters: check lora.target_modules")
    with _Stage("setting up per-sample gradients", device):
        reducer = None
        if io.world.distributed:
            num_params = sum(p.numel() for _, p in named)
            reducer = distributed.StepReducer(io.world, num_params, engine.parameter_device(model))
        optimizer = _make_optimizer(contract, [p for _, p in named])
        if control.is_control(contract):  # no clipping, no noise, no accountant (one process only)
            gsm, dp_opt, accountant = control.make_non_private(model, optimizer, plan=plan)
        else:
            gsm, dp_opt, accountant = engine.make_private(
                model,
                optimizer,
                plan=plan,
                unit_mean=contract.privacy.unit_clipping is UnitClipping.MEAN,
                per_sample=contract.privacy.per_sample.value,
                reducer=reducer,
            )
            engine.probe_per_sample_gradients(gsm, named, dp_opt)
    spec = RunSpec(
        contract=contract,
        plan=plan,
        unit_index=unit_index,
        examples=examples,
        pad_id=tokenizer.pad_token_id,
        device=device,
        dtype=dtype,
        allow_tf32=allow_tf32,
        threads=n_threads,
        run_id=uuid.uuid4().hex,
        out=out,
        staging=staging,
        world=io.world,
        tokenizer=tokenizer,
        held_out=held_out,
    )
    return spec, RunState(model=gsm, optimizer=dp_opt, accountant=accountant, named=named)


def _run_locked(
    contract: Contract, plan: TrainingPlan, table, unit_index, *, out: Path, staging: Path, io: _RunIO, held_out=None
):
    """The run proper, holding the output lock: ledger check, model and engine, the loop, the release."""
    log = io.log
    from dplora.run import checkpoint as ckpt
    from dplora.run import resume as resume_mod

    resumed = digest = None
    with distributed.gate(io.world):  # ranks other than 0 pass the same gate (see _follow)
        resumed, digest = resume_mod.resume_point(staging, contract, plan, unit_index) if io.resume else (None, None)
        ledger = _open_ledger(contract, plan, io, resumed and resumed.run_id)
        staging = resume_mod.prepare_staging(
            out, resuming=resumed is not None, overwrite=io.overwrite, ledger=ledger, log=log
        )
    try:
        with distributed.gate(io.world):
            spec, state = _build(contract, plan, table, unit_index, out=out, staging=staging, io=io, held_out=held_out)
            if resumed is not None:  # same run id: the ledger charge is the original reservation
                spec = dataclasses.replace(spec, run_id=resumed.run_id)
                ckpt.restore(spec, state, resumed)
        distributed.sync_state(io.world, state)  # W processes: every rank starts from rank 0's tensors and counts
    except BaseException as err:
        if getattr(err, "exit_code", None) == 2 and resumed is None:  # bad input: nothing written
            shutil.rmtree(staging, ignore_errors=True)
        elif resumed is None:
            _write_json(staging / "FAILED.json", _failure_entry(None, 0, plan.steps, 0.0, err))
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
    log(
        f"device: {spec.device} ({spec.dtype} base, fp32 LoRA), threads: {spec.threads}; N={plan.num_units} units, "
        f"q={plan.sample_rate:.4g}, T={plan.steps}, {mechanism}"
    )
    if control.is_control(contract):
        log(f"warning: {control.NO_DP_STATEMENT}")
    if io.world.distributed:
        low, high = distributed.expected_units_per_rank(plan.sample_rate, plan.num_units, io.world.world_size)
        log(
            f"distributed: {io.world.world_size} processes ({io.world.launcher}, {io.world.backend}); units sharded "
            f"by rank, expected {low:.4g}–{high:.4g} units per rank per step; noise drawn once per step on rank 0"
        )
    if ledger is not None and resumed is None and control.is_control(contract):
        ledger.reserve_non_private(
            population=contract.privacy.population,
            run_id=spec.run_id,
            adjacency=plan.adjacency.value,
            purpose="tuning" if io.tuning_trial else "release",
        )
    elif ledger is not None and resumed is None:
        ledger.reserve(
            population=contract.privacy.population,
            run_id=spec.run_id,
            epsilon=plan.epsilon,
            delta=plan.delta,
            accountant=plan.accountant.value,
            adjacency=plan.adjacency.value,
            protected_unit=contract.privacy.protected_unit.value,
            events=[ledger_event(plan)],
            purpose="tuning" if io.tuning_trial else "release",
        )
    if ledger is not None:
        ledger.set_checkpoint_path(spec.run_id, str(staging.resolve()))
    started = resumed.meta["started_at"] if resumed is not None else utc_now()
    checkpointer = ckpt.Checkpointer(
        spec, state, started_at=started, data_digest=digest or ckpt.data_sha256(contract), log=log, last=resumed
    )
    t0, first_step = time.perf_counter(), state.step
    try:
        evaluation = _train_and_release(spec, state, io=io, started=started, checkpointer=checkpointer)
        seconds = time.perf_counter() - t0
    except BaseException as err:
        _record_failure(spec, state, err, ledger, checkpointer.last)
        if isinstance(err, KeyboardInterrupt):
            name = str(err.args[0]) if err.args else "Ctrl-C"
            hint = resume_mod.resume_hint(spec, checkpointer.last)
            failed = spec.staging / "FAILED.json"
            raise KeyboardInterrupt(f"interrupted ({name}); no release was written; see {failed}; {hint}") from None
        if isinstance(err, DploraError) and not isinstance(err, TrainingFailedError):
            raise
        raise TrainingFailedError(resume_mod.failure_line(err, spec, state, checkpointer.last)) from err
    epsilon_spent = plan.epsilon_at(state.step)
    log(f"peak memory: {peak_memory_gib(spec.device):.2f} GiB ({_memory_kind(spec.device)})")
    ckpt.discard(staging)  # a resume checkpoint never leaves the partial folder
    kept = outputs.publish(staging, out)
    if kept is not None:
        log(f"warning: files appeared in {out} during the run; the old folder was kept as {kept}")
    if ledger is not None:
        ledger.settle(spec.run_id, epsilon_spent=epsilon_spent, status="settled")
    if ledger is not None and not control.is_control(contract) and io.ledger_release:
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
        seconds_per_step=seconds / max(plan.steps - first_step, 1),
        threads=spec.threads,
        differentially_private=not control.is_control(contract),
        evaluation=evaluation,
        run_id=spec.run_id,
    )


def _train_and_release(spec, state, *, io: _RunIO, started: str, checkpointer):
    """Run every planned step, check the accounting, evaluate on the held-out set if any, then write the adapters
    and the signed release. Returns the :class:`dplora.evaluate.heldout.Evaluation` or None."""
    from dplora.run.loop import run_steps
    from dplora.run.progress import ProgressReporter

    with (
        _open_metrics(spec.staging, state.step, _metrics_header(spec)) as metrics,
        ProgressReporter(enabled=io.progress) as bar,
        checkpointer,
    ):
        bar.start(spec.plan.steps)
        checkpointer.write()  # before step 1 (skipped when resuming from this step)
        run_steps(spec, state, metrics=metrics, progress=bar, after_step=_after_step(state, checkpointer))
    ranks = _check_accounted(spec, state)
    evaluation = _evaluate_held_out(spec, state, io)
    epsilon_spent = spec.plan.epsilon_at(state.step)
    _write_outputs(spec, state, started=started, epsilon_spent=epsilon_spent, io=io, ranks=ranks, evaluation=evaluation)
    return evaluation


def _evaluate_held_out(spec, state, io: _RunIO):
    """Base vs adapters on the held-out set (None without one); logs the numbers labelled, never held-out text.

    Private held-out numbers go to the private ``metrics.jsonl`` (:func:`metrics_path`) under ``not_covered_by_dp``
    only, never into the release folder; the caller puts them in the
    record only when the set is declared public. With W processes rank 0 evaluates alone, after the last step.
    """
    if spec.held_out is None:
        return None
    from dplora.engine.step import unwrap
    from dplora.evaluate.heldout import evaluate_model, held_out_source, report_lines

    source, public = held_out_source(spec.contract)
    evaluation = evaluate_model(
        unwrap(state.model),
        spec.tokenizer,
        spec.held_out,
        spec.contract,
        device=spec.device,
        source=source,
        public=public,
        private_run=not control.is_control(spec.contract),
    )
    for line in report_lines(evaluation):
        io.log(line)
    with metrics_path(spec.staging).open("a") as metrics:
        entry = {"eval": evaluation.to_dict()}
        metrics.write(json.dumps(entry if public else {"not_covered_by_dp": entry}) + "\n")
    return evaluation


def _metrics_header(spec) -> dict:
    """The first line of ``metrics.jsonl``; a non-private control's also says it carries no DP guarantee."""
    from dplora.run.loop import METRICS_HEADER

    if control.is_control(spec.contract):
        return {**METRICS_HEADER, "non_private": control.NO_DP_STATEMENT}
    return METRICS_HEADER


def _after_step(state, checkpointer):
    """Rank 0's hook after each step: the checkpointer's; with W processes a signal on any rank (seen in the
    step's reduction) stops every rank after the same step, rank 0 with a resume checkpoint."""
    reducer = getattr(state.optimizer, "reducer", None)
    if reducer is None:
        return checkpointer.after_step
    reducer.stop_requested = lambda: checkpointer.stopping

    def after_step(spec, state) -> None:
        if reducer.totals.get("stop"):
            checkpointer.request_stop("SIGTERM or SIGINT on another rank")
        checkpointer.after_step(spec, state)

    return after_step


def _check_accounted(spec, state) -> list[dict] | None:
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
    from dplora.engine.step import unwrap

    digest = distributed.adapter_digest(unwrap(state.model))
    return distributed.check_agreement(spec.world, steps=state.accountant.steps, digest=digest)


def _follow(contract: Contract, plan: TrainingPlan, table, unit_index, *, out: Path, staging: None, io: _RunIO):
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
        spec, state = _build(contract, plan, table, unit_index, out=out, staging=staging, io=io)
    distributed.sync_state(io.world, state)  # rank 0's LoRA tensors, optimizer state and step counts
    t0, first_step = time.perf_counter(), state.step
    signals = distributed.FollowerSignals(state.optimizer.reducer)
    with open(os.devnull, "w") as metrics, ProgressReporter(enabled=False) as bar, signals:
        run_steps(spec, state, metrics=metrics, progress=bar, after_step=signals.after_step)
    _check_accounted(spec, state)
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


def metrics_path(staging: Path) -> Path:
    """The run's per-step log, ``<output_dir>.partial/private/metrics.jsonl`` (published as
    ``<output_dir>.private/metrics.jsonl``, beside the release and never in it): realised units and records,
    losses and step times are computed on private data and not covered by ε. A ``.partial`` folder from before
    the private folder existed has its ``metrics.jsonl`` moved there."""
    private = outputs.private_staging(staging)
    path = private / outputs.METRICS_FILENAME
    legacy = Path(staging) / outputs.METRICS_FILENAME
    if legacy.is_file() and not path.is_file():
        legacy.rename(path)
    return path


def _open_metrics(staging: Path, resume_step: int, header: dict):
    """The private ``metrics.jsonl`` for appending: new with ``header``, or, when resuming, cut back to the
    checkpoint's step."""
    path = metrics_path(staging)
    if resume_step == 0 or not path.is_file():
        handle = path.open("w")
        handle.write(json.dumps(header) + "\n")
        return handle
    kept = [ln for ln in path.read_text().splitlines() if _metrics_step(ln) <= resume_step]
    handle = path.open("w")
    kept.append(json.dumps({"resumed_at_step": resume_step, "time": utc_now()}))
    handle.write("".join(ln + "\n" for ln in kept))
    return handle


def _metrics_step(line: str) -> float:
    """The step of one metrics line (0 for the header); a line cut by a kill is dropped (inf)."""
    try:
        return json.loads(line).get("step", 0)
    except (json.JSONDecodeError, AttributeError):
        return float("inf")


def _record_failure(spec, state, err: BaseException, ledger, last_checkpoint=None) -> None:
    """FAILED.json with the steps done and ε charged (never a release); settle the ledger charge as failed.

    With a resume checkpoint the charge stays pending at its reservation (≥ what was spent) until the run is
    resumed or ``dplora ledger settle`` closes it.
    """
    from dplora.run.resume import failure_fields

    plan, done = spec.plan, state.accountant.steps
    spent = plan.epsilon_spent(done)  # 0.0 at 0 steps; finite (the plan's checked curve)
    entry = _failure_entry(spec.run_id, done, plan.steps, spent, err)
    entry |= failure_fields(spec, state, err, last_checkpoint)
    try:
        _write_json(spec.staging / "FAILED.json", entry)
    except OSError:  # a full disk must not hide the original error
        pass
    (spec.staging / release.RELEASE_FILENAME).unlink(missing_ok=True)
    if ledger is not None and last_checkpoint is None:
        ledger.settle(spec.run_id, epsilon_spent=spent, status="failed")


def _memory_kind(device) -> str:
    return "torch.cuda.max_memory_allocated" if device.type == "cuda" else "process peak RSS"


def peak_memory_gib(device) -> float:
    """Peak memory of this process in GiB: ``torch.cuda.max_memory_allocated`` on CUDA, peak RSS on CPU."""
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def _failure_entry(run_id: str | None, done: int, planned: int, spent: float, err: BaseException) -> dict:
    """The content of FAILED.json: steps done, ε charged, the one-line reason (never training text)."""
    return {
        "run_id": run_id,
        "steps_done": done,
        "steps_planned": planned,
        "epsilon_charged_upper_bound": spent if math.isfinite(spent) else "infinite (non-private control)",
        "reason": _failure_reason(err),
        "time": utc_now(),
        "release": "none (run failed)",
    }


def _failure_reason(err: BaseException) -> str:
    """One line for FAILED.json: a DploraError's message, "SIGTERM" (the CLI's handler names it), or the class."""
    if isinstance(err, DploraError):
        return str(err)
    if isinstance(err, KeyboardInterrupt) and err.args:
        return str(err.args[0])
    return err.__class__.__name__


def _write_outputs(spec, state, *, started: str, epsilon_spent: float, io: _RunIO, ranks=None, evaluation=None) -> None:
    """Save the adapters and the resolved contract, then finish and sign the release (inside ``staging``).

    A control run signs its own non-private record (:mod:`dplora.engine.control`), never the DP one. A held-out
    evaluation enters the record only when its set is declared public.
    """
    from dplora.engine.model import base_model_entry

    contract, plan = spec.contract, spec.plan
    staging = spec.staging.resolve()
    from dplora.engine.step import unwrap

    unwrap(state.model).save_pretrained(staging / "adapter")
    (staging / "contract.yaml").write_text(contract.to_yaml())
    common = {
        "contract": contract,
        "plan": plan,
        "run_id": spec.run_id,
        "steps_done": state.step,
        "started_at": started,
        "finished_at": utc_now(),
        "data_digest": release.data_digest_entry([Path(contract.data.path)], io.data_key),
        "base_model": base_model_entry(contract.model, io.log),
        "execution": execution_entry(spec, reducer=getattr(state.optimizer, "reducer", None), ranks=ranks),
    }
    if control.is_control(contract):  # its own predicate type (release.predicate_type_of), no ε
        record = non_private_record(**common)
    else:
        record = build_record(**common, epsilon_spent=epsilon_spent)
    if evaluation is not None and evaluation.public:
        record["evaluation"] = evaluation.to_dict()
    release.finish_release(staging, contract, record, private_key=io.private_key)
