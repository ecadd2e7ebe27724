"""A run's set-up before step 1: the output folder and its lock, the model with its LoRA adapters, the optimizer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dplora import atomic
from dplora.contract.choices import Sharding
from dplora.contract.spec import LoraSection, ModelSection, TrainingSection
from dplora.engine import distributed
from dplora.engine.lora import library_error_line, library_warnings, resolve_target_modules
from dplora.errors import BadInputError, excerpt
from dplora.recipe.options import RunOptions
from dplora.run import outputs


def prepare_output(training: TrainingSection, overwrite: bool, protected=()) -> tuple[Path, Path]:
    """The output folder (``training.output_dir``) and its ``.partial`` sibling; refusals follow
    :func:`dplora.run.outputs.check_output_dir`."""
    try:
        out = outputs.check_output_dir(training.output_dir, overwrite=overwrite, protected=protected)
    except OSError as err:  # a name too long for the file system, a permission denied on a parent
        where = f"training.output_dir={excerpt(training.output_dir, 200)}"
        raise BadInputError(f"{where}: {err.strerror or err.__class__.__name__}") from None
    return out, outputs.staging_path(out)


def lock_output(out: Path):
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


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as JSON to ``path`` whole or not at all (:func:`dplora.atomic.write_json`)."""
    atomic.write_json(path, obj)


def setup_model(
    model: ModelSection,
    lora: LoraSection,
    training: TrainingSection,
    device,
    dtype: str,
    allow_tf32: bool,
    log,
    world: distributed.World = distributed.SINGLE,
):
    """Load the base model in ``dtype`` on ``device``, then wrap it with fp32 LoRA adapters (peft).

    ``training.sharding: fsdp`` loads the base sharded 1/W over ``world``'s ranks
    (:func:`dplora.engine.sharding.load_sharded_base`) before peft wraps it, so the LoRA tensors stay whole.

    ``model``, ``lora`` and ``training`` are the contract's sections (the base model; r, alpha, targets; the
    seed of the LoRA initialisation and gradient checkpointing).

    ``lora.target_modules`` is resolved against the loaded model (:func:`dplora.engine.lora.resolve_target_modules`);
    library warnings become one ``note:`` line each (:func:`dplora.engine.lora.library_warnings`).

    Raises:
        BadInputError: a target module the model lacks, or peft refusing the LoRA config (one line, exit 2).
    """
    import torch
    from peft import LoraConfig, get_peft_model

    from dplora.engine.model import enable_gradient_checkpointing, load_base_model

    with library_warnings(log):
        # on its device BEFORE get_peft_model (cases T1); model.quantization: 4bit loads NF4 Linear4bit layers
        if training.sharding is Sharding.FSDP:
            from dplora.engine.sharding import load_sharded_base

            base, tokenizer = load_sharded_base(model, device, dtype, allow_tf32, world, log)
        else:
            base, tokenizer = load_base_model(model, device, dtype, allow_tf32, log)
        if training.gradient_checkpointing:
            enable_gradient_checkpointing(base)  # non-reentrant; the contract refuses it on the Opacus path
        targets = resolve_target_modules(base, lora.target_modules)
        torch.manual_seed(training.seed)  # the recorded seed: LoRA initialisation only
        config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=targets,
            fan_in_fan_out=_conv1d_targets(base, targets),
            bias="none",
            task_type="CAUSAL_LM",
        )
        try:
            peft_model = get_peft_model(base, config, autocast_adapter_dtype=True)  # LoRA tensors in fp32
        except ValueError as err:
            shown = targets if isinstance(targets, str) else list(targets)
            raise BadInputError(f"lora.target_modules={shown}: {library_error_line(err)}") from None
    if lora.freeze_a:  # FFA-LoRA: A keeps its seeded init; only B is trained (no gradient, noise or update for A)
        freeze_lora_a(peft_model)
    for _, p in peft_model.named_parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
    torch.seed()  # everything random from here on (dropout) draws from OS entropy, not the recorded seed
    peft_model.train()
    return peft_model, tokenizer


def freeze_lora_a(peft_model) -> list[str]:
    """Make every LoRA A weight of ``peft_model`` non-trainable (FFA-LoRA, ``lora.freeze_a``): A keeps its value.

    Args:
        peft_model: a peft model with LoRA adapters (``lora_A`` modules), before the optimizer is built.
    Returns:
        The names of the tensors frozen, in ``named_parameters`` order.
    Raises:
        BadInputError: the model has no LoRA A tensor (nothing to freeze).
    Source: Sun, Qin, Wang, Zhu, Wang and Li (ICLR 2024), "Improving LoRA in Privacy-preserving Federated
    Learning", §4: A fixed at its random initialisation, only B trained.
    """
    names = [n for n, p in peft_model.named_parameters() if ".lora_A." in n and p.requires_grad]
    if not names:
        raise BadInputError("lora.freeze_a: the model has no trainable LoRA A tensor")
    for n, p in peft_model.named_parameters():
        if n in names:
            p.requires_grad_(False)
    return names


def _conv1d_targets(model, targets) -> bool:
    """True when the named targets are transformers ``Conv1D`` layers (GPT-2): peft then needs fan_in_fan_out."""
    if isinstance(targets, str):
        return False
    from transformers.pytorch_utils import Conv1D

    return any(isinstance(m, Conv1D) and n.rsplit(".", 1)[-1] in targets for n, m in model.named_modules())


def make_optimizer(training: TrainingSection, params, *, noise_variance: float = 0.0):
    """``training.optimizer`` (SGD, Adam, AdamW or DP-AdamBC) over ``params`` at ``training.lr`` and
    ``weight_decay``; DP-AdamBC subtracts ``noise_variance`` Φ = (σC/E)² (the mechanism's) from its second moment.

    Raises:
        ValueError: a negative or non-finite ``noise_variance`` (DP-AdamBC).
    """
    import torch

    lr, wd = training.lr, training.weight_decay
    name = training.optimizer.value
    if name == "dp_adambc":
        from dplora.mechanism.adambc import DPAdamBC

        return DPAdamBC(params, lr=lr, noise_variance=noise_variance, weight_decay=wd)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=wd)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    return torch.optim.AdamW(params, lr=lr, weight_decay=wd)


def quiet_log(message: str) -> None:
    """The log of ranks other than 0: rank 0 reports for the run."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunIO:
    """What one run holds besides the contract, the plan and the mechanism: the caller's options and what the run
    resolved from them (loaded keys, the process group, the logs, the start time).

    Attributes:
        options: the caller's :class:`dplora.recipe.options.RunOptions` (unchanged).
        private_key: the loaded Ed25519 signing key (rank 0), or None.
        data_key: the data owner's HMAC key bytes, or None.
        log: the public log (rank 0's; other ranks print nothing).
        progress: progress reports on (``options.progress`` on rank 0 only).
        world: the run's processes.
        private: :class:`dplora.surface.PrivateLog`, the run's private diagnostics (never on the public log).
        started_at: UTC, taken before the data is read: the only time a release records.
    """

    options: RunOptions
    private_key: object
    data_key: bytes | None
    log: object
    progress: bool
    world: distributed.World = distributed.SINGLE
    private: object = None
    started_at: str = ""
