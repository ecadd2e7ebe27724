"""Building a run before step 1 from its compiled :class:`dplora.run.config.RunConfig`: the model with its LoRA
adapters, the tokens, the held-out set, the public warm start, the mechanism and its per-example path, the frozen
``RunSpec`` and the mutable ``RunState`` (each stage named in a failure's message). Also ``budget --estimate``,
which builds the same engine without data and times a synthetic step.
"""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path

from dplora.contract.spec import DataSection
from dplora.data import tokens as tokenizing
from dplora.engine import distributed
from dplora.engine.lora import check_pad_embedding, setup_model
from dplora.engine.schedule import make_scheduler
from dplora.errors import BadInputError, DploraError, TrainingFailedError
from dplora.mechanism.adambc import make_optimizer
from dplora.run.config import RunConfig
from dplora.run.loop import RunSpec, RunState
from dplora.surface import PrivateLog


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


def build_run(
    config: RunConfig,
    data: DataSection,
    table,
    unit_index,
    *,
    out: Path,
    staging: Path | None,
    log=print,
    private: PrivateLog | None = None,
    held_out=None,
    warm: bool = True,
) -> tuple[RunSpec, RunState]:
    """Model, tokens and the private engine on the chosen device: (RunSpec, RunState). Writes nothing.

    Args:
        config: the compiled run.
        data: the data spec (``contract.data``): record format, columns, held-out set, public warm start.
        table, unit_index: the training records (``datasets.Dataset``) and their protected units.
        out, staging: the output folder and ``<out>.partial`` (None on ranks other than 0).
        log: the public log; private: the private diagnostics (truncation counts, a skipped evaluation).
        held_out: the held-out records or None; warm: run the public warm start (False when resuming: the
            checkpoint holds its adapters).

    Raises:
        BadInputError: the model, its tokens or the held-out set (when public) cannot be used (exit 2).
        TrainingFailedError: a setup stage failed (named in the one-line message).
    """
    private = private if private is not None else PrivateLog()
    model, tokenizer, device, dtype, allow_tf32, threads = _load(config, log)
    examples = _encode(config, data, table, tokenizer, private)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if config.world.distributed:  # the same weights, tokenizer, tokens, LoRA init and library versions on every rank
        from dplora.engine.basefiles import base_model_entry

        entry = base_model_entry(config.model, log)
        distributed.check_same_inputs(config.world, distributed.model_digests(entry, examples, named))
    held_out = _checked_held_out(config, data, held_out, tokenizer, private)
    if not named:
        raise BadInputError("no trainable parameters: check lora.target_modules")
    warm_entry = None  # data.public_warm_start: noise-free steps on the public file before the DP engine is built
    if data.public_warm_start is not None and warm:
        from dplora.data.public import public_data
        from dplora.engine.warmstart import warm_start

        public = public_data(data)  # the public file's section: no private path in it
        warm_entry = warm_start(public, config, model, tokenizer, log=log)
    mechanism, optimizer, (gsm, dp_opt, accountant) = _private_engine(config, model, named, device, log)
    physical = _physical_batch(config, gsm, dp_opt, named, tokenizer, device, log=log)
    from dplora.data.chat import tokenization_entry

    spec = RunSpec(
        config=config,
        unit_index=unit_index,
        examples=examples,
        pad_id=tokenizer.pad_token_id,
        device=device,
        dtype=dtype,
        allow_tf32=allow_tf32,
        threads=threads,
        run_id=uuid.uuid4().hex,
        out=out,
        staging=staging,
        mechanism=mechanism,
        tokenizer=tokenizer,
        tokenization=tokenization_entry(tokenizer, data),
        held_out=held_out,
        physical_batch=physical,
        attn_implementation=getattr(model.config, "_attn_implementation", None),  # auto resolved at load
        warm_start=warm_entry,
    )
    plan = config.plan
    scheduler = make_scheduler(
        optimizer, schedule=plan.lr_schedule, warmup_steps=plan.warmup_steps, total_steps=plan.steps
    )
    return spec, RunState(model=gsm, optimizer=dp_opt, accountant=accountant, named=named, scheduler=scheduler)


def _load(config: RunConfig, log):
    """Threads, device, precision, then the model with its LoRA adapters and the tokenizer (stage "loading the
    model"): (model, tokenizer, device, dtype, allow_tf32, threads)."""
    import torch

    from dplora.engine import runtime
    from dplora.engine.model import resolve_precision, select_device

    # Opacus hooks on a frozen base: inputs need no grad, which is expected here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
    # W processes on one node share its free cores
    n_threads = config.flags.threads or max(1, runtime.free_threads() // config.world.local_world_size)
    torch.set_num_threads(n_threads)
    device = select_device()
    dtype, allow_tf32 = resolve_precision(config.model, device)
    with _Stage("loading the model", device):
        model, tokenizer = setup_model(config.model, config.lora, config, device, dtype, allow_tf32, log, config.world)
    check_pad_embedding(model, tokenizer)
    return model, tokenizer, device, dtype, allow_tf32, n_threads


def _encode(config: RunConfig, data: DataSection, table, tokenizer, private: PrivateLog):
    """Token ids and labels per record; the truncation counts go to the private log only (they are private)."""
    examples, cut = tokenizing.encode_records(table, tokenizer, data, max_seq_len=config.max_seq_len)
    if cut is not None and cut.truncated:  # private counts: the operator's terminal only
        private(
            f"data: {cut.truncated} of {cut.records} records truncated to training.max_seq_len={config.max_seq_len}, "
            f"{cut.dropped} dropped from the loss (no target token left), {cut.turns_dropped} turns and "
            f"{cut.tokens_cut} tokens not trained on"
            + (
                f"; on {cut.unstable} records the chat template stopped being prefix-stable at a turn "
                "(kept up to that turn)"
                if cut.unstable
                else ""
            )
        )
    if data.task == "classification":
        _label_note(data, table, private)
    return examples


def _label_note(data: DataSection, table, private: PrivateLog) -> None:
    """The training records whose label (the response, stripped) is outside the declared set, counted in the
    private log only: they are trained on as written, never refused (refusing would make the exit code follow one
    record), and a count that follows the data is a private number (Zhao et al. 2021 score only declared labels)."""
    from dplora.contract.labels import declared_labels
    from dplora.evaluate.classify import gold_labels

    known = set(declared_labels(data))
    gold = gold_labels(table, data)
    outside = sum(y not in known for y in gold)
    if outside:
        private(
            f"data: {outside} of {len(gold)} training records have a label outside the declared set "
            f"({len(known)} labels); they are trained on as written, and scored wrong when held out"
        )


def _checked_held_out(config: RunConfig, data: DataSection, held_out, tokenizer, private: PrivateLog):
    """The held-out set checked before training: a public file's problem refuses the run (exit 2); a private
    set's problem skips the evaluation (said privately), so the exit code never depends on private data."""
    if held_out is None:
        return None
    from dplora.evaluate.heldout import HeldOutDataProblem, check_held_out

    try:
        check_held_out(held_out, tokenizer, data, config)
    except HeldOutDataProblem as err:
        if data.eval_public:  # a public file: its problem is public, refuse before training
            raise
        # A private held-out set that cannot be evaluated (no unit fell on the held-out side, every reply cut
        # away) must not decide whether the run releases: that would make the exit code a statistic of the
        # private data. Train and release; skip the evaluation, and say why privately.
        private(f"held-out evaluation skipped: {err}")
        held_out = None
    return held_out


def _private_engine(config: RunConfig, model, named, device, log):
    """The mechanism (``config.mechanism()``), its cross-rank reducer, the optimizer and the wrapped step; for a DP
    run the per-example check on synthetic batches (stage "setting up per-sample gradients").
    Returns (mechanism, optimizer, (per-sample model, step optimizer, accountant))."""
    from dplora.engine import gradcheck, runtime

    with _Stage("setting up per-sample gradients", device):
        mechanism = config.mechanism()
        reducer = mechanism.reducer(sum(p.numel() for _, p in named), runtime.parameter_device(model))
        optimizer, parts = _step_parts(config, model, named, mechanism, reducer=reducer)
        if mechanism.private:
            gradcheck.probe_per_sample_gradients(parts[0], named, parts[1], log=log)
    return mechanism, optimizer, parts


def _physical_batch(config: RunConfig, gsm, dp_opt, named, tokenizer, device, *, log) -> int | None:
    """Records per forward for ``training.physical_batch_size: auto``, probed on synthetic batches (no private
    data) and said on ``log``; None for a fixed number. Shared by training and ``budget --estimate``."""
    if config.flags.physical_batch_size != "auto":
        return None
    from dplora.engine import runtime
    from dplora.engine.membatch import probe_physical_batch

    with _Stage("probing the physical batch", device):
        physical = probe_physical_batch(
            gsm,
            dp_opt,
            named,
            max_seq_len=config.max_seq_len,
            pad_id=tokenizer.pad_token_id,
            device=runtime.parameter_device(gsm),
        )
    log(f"physical batch: {physical} records per forward (probed on synthetic batches)")
    return physical


def probe_estimate(contract, plan, model, optimizer, named, *, pad_id: int, physical: int, world_size=1, done_steps=0):
    """Time one synthetic step and return the public estimate's inputs (:mod:`dplora.plan.estimate`), or None.

    Args:
        contract, plan: the resolved contract and its plan (public keys and numbers only).
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


def estimate_without_data(contract, plan, *, threads: int | None = None, log=print):
    """``dplora budget --estimate``: load the model and engine as ``train`` does (no data) and time a synthetic step.

    The per-example path, the optimizer and the physical batch (the contract's, or probed on synthetic batches
    for ``auto``) are those of a run; no token of the data is read (the plan is made before, from public inputs).

    Returns:
        :class:`dplora.plan.estimate.EstimateInputs`, or None when the probe batch does not fit in memory.

    Raises:
        BadInputError, TrainingFailedError: the model cannot be loaded or set up (as in ``train``).
    """
    from dplora.recipe.config import RunOptions, compile_run

    config = compile_run(contract, plan, RunOptions(threads=threads))
    model, tokenizer, device, *_ = _load(config, log)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise BadInputError("no trainable parameters: check lora.target_modules")
    with _Stage("setting up per-sample gradients", device):
        _, (gsm, dp_opt, _) = _step_parts(config, model, named, config.mechanism())
    probed = _physical_batch(config, gsm, dp_opt, named, tokenizer, device, log=lambda *_: None)
    physical = config.flags.fixed_physical_batch_size if probed is None else probed
    return probe_estimate(contract, plan, gsm, dp_opt, named, pad_id=tokenizer.pad_token_id, physical=physical)


def _step_parts(config: RunConfig, model, named, mechanism, *, reducer=None):
    """The optimizer and the step's parts for ``named`` (the trainable LoRA tensors): (optimizer, (per-sample
    model, step optimizer, accountant)) from ``mechanism.wrap`` (:class:`dplora.mechanism.core.DPMechanism`: the
    DP optimizer over units, or the control's step with no clipping, noise or accountant). Shared by training and
    the time estimate's synthetic probe, so both time the same per-example path."""
    optimizer = make_optimizer(config, [p for _, p in named], noise_variance=mechanism.noise_variance)
    return optimizer, mechanism.wrap(model, optimizer, reducer=reducer)
