"""Building a run before step 1: the ledger reservation, the model and its per-sample gradient path, the frozen
``RunSpec`` and the mutable ``RunState`` (each stage named in a failure's message).
"""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path

from dplora.contract.choices import UnitClipping
from dplora.contract.spec import Contract, DataSection, LoraSection, ModelSection, PrivacySection, TrainingSection
from dplora.data import tokens as tokenizing
from dplora.engine import distributed, warmstart
from dplora.engine.schedule import make_scheduler
from dplora.errors import BadInputError, DploraError, PlanRefusedError, TrainingFailedError
from dplora.mechanism import control
from dplora.plan.training import TrainingPlan
from dplora.recipe.setup import (
    RunIO,
    make_optimizer,
    setup_model,
)


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


def open_ledger(privacy: PrivacySection, plan: TrainingPlan, io: RunIO, resumed_run: str | None = None):
    """The ledger with room for the plan; a resumed run instead needs its own charge still pending.

    Every DP run is recorded: without ``privacy.population`` as an unassigned run, whose ledger is opened (and
    created if missing) only when the run reserves its charge, after setup, so that bad input found during setup
    writes nothing (None here; :func:`dplora.recipe.train._reserve`). A resumed unassigned run needs its ledger
    now. A non-private control without a population is not charged (None).
    """
    from dplora.ledger.store import Ledger, default_ledger_path

    if not privacy.population:
        if control.is_control(privacy):
            return None
        if resumed_run is None:  # --overwrite may discard an unassigned run's checkpoint: settle its charge then
            path = io.options.ledger_path or default_ledger_path()
            return Ledger(path, create=False) if io.options.overwrite and Path(path).is_file() else None
        ledger = Ledger(io.options.ledger_path or default_ledger_path(), create=False)
        _check_resumable(ledger, resumed_run)
        return ledger

    if control.is_control(privacy) and not io.options.non_private:
        pop = privacy.population
        raise PlanRefusedError(
            f"privacy.enabled=false on population {pop!r}: a non-private run is charged ε=∞ in the ledger, over "
            f"any cap, and every later DP run on {pop!r} is then refused; pass --non-private to run it anyway"
        )
    ledger = Ledger(io.options.ledger_path or default_ledger_path(), create=False)  # a missing ledger fails closed
    if resumed_run is None and not control.is_control(privacy):
        from dplora.ledger.plans import check_plans

        check_plans(ledger, privacy, [plan])
    elif resumed_run is not None:
        _check_resumable(ledger, resumed_run)
    return ledger


def _check_resumable(ledger, resumed_run: str) -> None:
    """A resumed run needs its own charge, still pending, in this ledger. Raises: BadInputError."""
    try:
        status = ledger.charge(resumed_run).status
    except BadInputError:
        raise BadInputError(
            f"--resume: run {resumed_run} has no charge in ledger {ledger.path}: pass the ledger it was charged in"
        ) from None
    if status != "pending":
        raise BadInputError(f"--resume: run {resumed_run} is already {status} in ledger {ledger.path}: start anew")


def build_run(
    contract: Contract, plan: TrainingPlan, table, unit_index, *, out: Path, staging: Path, io: RunIO, held_out=None
):
    """Model, tokens and the private engine on the chosen device: (RunSpec, RunState). Writes nothing.

    Raises:
        BadInputError: the model, its tokens or the held-out set (when public) cannot be used (exit 2).
        TrainingFailedError: a setup stage failed (named in the one-line message).
    """
    from dplora.run.loop import RunSpec, RunState

    loaded = _load(contract.model, contract.lora, contract.training, io)
    model, tokenizer, device = loaded["model"], loaded["tokenizer"], loaded["device"]
    examples = _encode(contract.data, contract.training, table, tokenizer, io)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if io.world.distributed:  # the same weights, tokenizer, tokens, LoRA init and library versions on every rank
        from dplora.engine.basefiles import base_model_entry

        entry = base_model_entry(contract.model, io.log)
        distributed.check_same_inputs(io.world, distributed.model_digests(entry, examples, named))
    held_out = _checked_held_out(contract.data, contract.training, held_out, tokenizer, io)
    if not named:
        raise BadInputError("no trainable parameters: check lora.target_modules")
    warm = None  # data.public_warm_start: noise-free steps on the public file (on resume the checkpoint holds them)
    if contract.data.public_warm_start is not None and not io.options.resume:
        public = warmstart.public_data(contract.data)  # the public file's section: no private path in it
        warm = warmstart.warm_start(public, contract.training, model, tokenizer, log=io.log)
    engine = _private_engine(contract.privacy, contract.training, plan, model, named, device, io)
    mechanism, optimizer, (gsm, dp_opt, accountant) = engine
    physical = _physical_batch(contract.training, gsm, dp_opt, named, tokenizer, device, log=io.log)
    spec = RunSpec(
        contract=contract,
        plan=plan,
        unit_index=unit_index,
        examples=examples,
        pad_id=tokenizer.pad_token_id,
        device=device,
        dtype=loaded["dtype"],
        allow_tf32=loaded["allow_tf32"],
        threads=loaded["threads"],
        run_id=uuid.uuid4().hex,
        out=out,
        staging=staging,
        world=io.world,
        tokenizer=tokenizer,
        held_out=held_out,
        physical_batch=physical,
        attn_implementation=getattr(model.config, "_attn_implementation", None),  # auto resolved at load
        mechanism=mechanism,
        warm_start=warm,
    )

    scheduler = make_scheduler(
        optimizer, schedule=plan.lr_schedule, warmup_steps=plan.warmup_steps, total_steps=plan.steps
    )
    return spec, RunState(model=gsm, optimizer=dp_opt, accountant=accountant, named=named, scheduler=scheduler)


def _load(model_section: ModelSection, lora: LoraSection, training: TrainingSection, io: RunIO) -> dict:
    """Threads, device, precision, then the model with its LoRA adapters and the tokenizer (stage "loading the
    model"): a dict of model, tokenizer, device, dtype, allow_tf32, threads."""
    import torch

    from dplora.engine import runtime
    from dplora.engine.model import resolve_precision, select_device

    # Opacus hooks on a frozen base: inputs need no grad, which is expected here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
    # W processes on one node share its free cores
    n_threads = io.options.threads or training.threads or max(1, runtime.free_threads() // io.world.local_world_size)
    torch.set_num_threads(n_threads)
    device = select_device()
    dtype, allow_tf32 = resolve_precision(model_section, device)
    with _Stage("loading the model", device):
        model, tokenizer = setup_model(model_section, lora, training, device, dtype, allow_tf32, io.log, io.world)
    _check_pad_embedding(model, tokenizer)
    return {
        "model": model, "tokenizer": tokenizer, "device": device, "dtype": dtype, "allow_tf32": allow_tf32,
        "threads": n_threads,
    }  # fmt: skip


def _encode(data: DataSection, training: TrainingSection, table, tokenizer, io: RunIO):
    """Token ids and labels per record; the truncation counts go to the private log only (they are private)."""
    examples, truncation = tokenizing.encode_records(table, tokenizer, data, max_seq_len=training.max_seq_len)
    if truncation is not None and truncation.truncated:  # private counts: the operator's terminal only
        io.private(
            f"data: {truncation.truncated} of {truncation.records} records "
            f"truncated to training.max_seq_len={training.max_seq_len}, {truncation.dropped} dropped from "
            f"the loss (no target token left), {truncation.turns_dropped} turns and {truncation.tokens_cut} tokens "
            "not trained on"
            + (
                f"; on {truncation.unstable} records the chat template stopped being prefix-stable at a turn "
                "(kept up to that turn)"
                if truncation.unstable
                else ""
            )
        )
    return examples


def _checked_held_out(data: DataSection, training: TrainingSection, held_out, tokenizer, io: RunIO):
    """The held-out set checked before training: a public file's problem refuses the run (exit 2); a private
    set's problem skips the evaluation (said privately), so the exit code never depends on private data."""
    if held_out is None:
        return None
    from dplora.evaluate.heldout import HeldOutDataProblem, check_held_out

    try:
        check_held_out(held_out, tokenizer, data, training)
    except HeldOutDataProblem as err:
        if data.eval_public:  # a public file: its problem is public, refuse before training
            raise
        # A private held-out set that cannot be evaluated (no unit fell on the held-out side, every reply cut
        # away) must not decide whether the run releases: that would make the exit code a statistic of the
        # private data (issue 40). Train and release; skip the evaluation, and say why privately.
        io.private(f"held-out evaluation skipped: {err}")
        held_out = None
    return held_out


def _private_engine(
    privacy: PrivacySection, training: TrainingSection, plan: TrainingPlan, model, named, device, io: RunIO
):
    """The mechanism (:func:`mechanism_for`), its cross-rank reducer, the optimizer and the wrapped step; for a DP
    run the per-example check on synthetic batches (stage "setting up per-sample gradients").
    Returns (mechanism, optimizer, (per-sample model, step optimizer, accountant))."""
    from dplora.engine import gradcheck, runtime

    with _Stage("setting up per-sample gradients", device):
        mechanism = mechanism_for(privacy, plan, io.world)
        reducer = mechanism.reducer(sum(p.numel() for _, p in named), runtime.parameter_device(model))
        optimizer, parts = _step_parts(training, model, named, mechanism, reducer=reducer)
        if mechanism.private:
            gradcheck.probe_per_sample_gradients(parts[0], named, parts[1], log=io.log)
    return mechanism, optimizer, parts


def _physical_batch(training: TrainingSection, gsm, dp_opt, named, tokenizer, device, *, log) -> int | None:
    """Records per forward for ``training.physical_batch_size: auto``, probed on synthetic batches (no private
    data) and said on ``log``; None for a fixed number. Shared by training and ``budget --estimate``."""
    if training.physical_batch_size != "auto":
        return None
    from dplora.engine import runtime
    from dplora.engine.membatch import probe_physical_batch

    with _Stage("probing the physical batch", device):
        physical = probe_physical_batch(
            gsm,
            dp_opt,
            named,
            max_seq_len=training.max_seq_len,
            pad_id=tokenizer.pad_token_id,
            device=runtime.parameter_device(gsm),
        )
    log(f"physical batch: {physical} records per forward (probed on synthetic batches)")
    return physical


def probe_estimate(
    contract: Contract,
    plan: TrainingPlan,
    model,
    optimizer,
    named,
    *,
    pad_id: int,
    physical: int,
    world_size=1,
    done_steps: int = 0,
):
    """Time one synthetic step and return the public estimate's inputs (:mod:`dplora.plan.estimate`), or None.

    Args:
        model, optimizer, named: the run's per-example model, its optimizer and trainable tensors.
        pad_id: the tokenizer's pad id; physical: records per forward; world_size: W; done_steps: steps already run.

    Returns:
        :class:`dplora.plan.estimate.EstimateInputs`, or None when the probe batch does not fit in memory.
    """
    from dplora.engine import runtime
    from dplora.engine.membatch import time_synthetic_step
    from dplora.plan.estimate import estimate_inputs

    device = runtime.parameter_device(model)
    with _Stage("timing a synthetic step", device):
        seconds = time_synthetic_step(
            model,
            optimizer,
            named,
            batch_size=physical,
            max_seq_len=contract.training.max_seq_len,
            pad_id=pad_id,
            device=device,
        )
    if seconds is None:
        return None
    return estimate_inputs(
        contract,
        plan,
        physical_batch=physical,
        probe_seconds=seconds,
        device=str(device),
        world_size=world_size,
        done_steps=done_steps,
    )


def estimate_without_data(contract: Contract, plan: TrainingPlan, *, threads: int | None = None, log=print):
    """``dplora budget --estimate``: load the model and engine as ``train`` does (no data) and time a synthetic step.

    The per-example path, the optimizer and the physical batch (the contract's, or probed on synthetic batches
    for ``auto``) are those of a run; no token of the data is read (the plan is made before, from public inputs).

    Returns:
        :class:`dplora.plan.estimate.EstimateInputs`, or None when the probe batch does not fit in memory.

    Raises:
        BadInputError, TrainingFailedError: the model cannot be loaded or set up (as in ``train``).
    """
    import torch

    from dplora.engine import runtime
    from dplora.engine.model import resolve_precision, select_device

    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    n_threads = threads or contract.training.threads or max(1, runtime.free_threads())
    torch.set_num_threads(n_threads)
    device = select_device()
    dtype, allow_tf32 = resolve_precision(contract.model, device)
    with _Stage("loading the model", device):
        model, tokenizer = setup_model(contract.model, contract.lora, contract.training, device, dtype, allow_tf32, log)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise BadInputError("no trainable parameters: check lora.target_modules")
    with _Stage("setting up per-sample gradients", device):
        mechanism = mechanism_for(contract.privacy, plan, distributed.SINGLE)
        _, (gsm, dp_opt, _) = _step_parts(contract.training, model, named, mechanism)
    probed = _physical_batch(contract.training, gsm, dp_opt, named, tokenizer, device, log=lambda *_: None)
    physical = contract.training.physical_batch_size if probed is None else probed
    return probe_estimate(contract, plan, gsm, dp_opt, named, pad_id=tokenizer.pad_token_id, physical=physical)


def _check_pad_embedding(model, tokenizer) -> None:
    """Refuse a base model whose padding token's input embedding is not finite (a fact about the PUBLIC model).

    Records share a physical batch right-padded to its longest record. Attention gives the pad positions weight
    0, but 0 · NaN is NaN: a NaN pad embedding would turn a shorter record's loss and gradient NaN whenever a longer
    neighbour shares its batch, so one unit's length would decide whether another unit counts (issue 41 red team).

    Raises:
        BadInputError: the pad token's embedding row holds a non-finite value.
    """
    import torch

    pad = tokenizer.pad_token_id
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    if pad is None or weight is None or weight.dim() != 2 or not 0 <= pad < weight.shape[0]:
        return
    if weight.dtype in (torch.uint8, torch.int8) or not weight.dtype.is_floating_point:
        return  # a quantized table: its dequantized rows are checked by the per-example check's forward
    if hasattr(weight, "to_local"):  # training.sharding: fsdp: the rank that holds the pad row checks it
        import torch.distributed as dist

        from dplora.engine.sharding import local_rows

        start, local = local_rows(weight)
        row = local[pad - start] if start <= pad < start + local.shape[0] else None
        # ...and every rank learns its answer (one all_gather_object), so that all refuse alike (exit 2, nothing
        # written): a refusal on that rank alone left the others in the next collective (issue 45 red team)
        bad: list = [None] * dist.get_world_size()
        dist.all_gather_object(bad, row is not None and not bool(torch.isfinite(row).all()))
        finite = not any(bad)
    else:
        finite = bool(torch.isfinite(weight[pad]).all())
    if not finite:
        raise BadInputError(
            f"the base model's embedding of the padding token (id {pad}) is not finite: padded records would get "
            "NaN losses from their batch-mates; use a model with finite embeddings (or another pad token)"
        )


def mechanism_for(privacy: PrivacySection, plan: TrainingPlan, world):
    """The run's :class:`dplora.mechanism.core.DPMechanism`: the plan, the per-example path and unit clipping
    (``privacy.per_sample``, ``privacy.unit_clipping``), the process group; the control for ``privacy.enabled:
    false``."""
    from dplora.mechanism.core import PerformanceFlags, make_mechanism

    flags = PerformanceFlags(per_sample=privacy.per_sample)
    unit_mean = privacy.unit_clipping is UnitClipping.MEAN
    return make_mechanism(plan, flags, world, private=privacy.enabled, unit_mean=unit_mean)


def _step_parts(training: TrainingSection, model, named, mechanism, *, reducer=None):
    """The optimizer and the step's parts for ``named`` (the trainable LoRA tensors): (optimizer, (per-sample
    model, step optimizer, accountant)) from ``mechanism.wrap`` (:class:`dplora.mechanism.core.DPMechanism`: the
    DP optimizer over units, or the control's step with no clipping, noise or accountant). Shared by training and
    the time estimate's synthetic probe, so both time the same per-example path."""
    optimizer = make_optimizer(training, [p for _, p in named], noise_variance=mechanism.noise_variance)
    return optimizer, mechanism.wrap(model, optimizer, reducer=reducer)
