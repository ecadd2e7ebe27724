"""Which modules of a loaded model get LoRA adapters: ``auto``, ``all-linear`` or an explicit list, checked against
the model's own module names before peft wraps it; library warnings and errors turned into one short line each.

``auto`` reads the names present in the model (the first group of an ordered candidate list whose every name is a
linear leaf of the model), so an unknown architecture with the usual attention names works too:
Llama/Qwen2/Qwen3/Mistral/Gemma/Phi-1/2/OPT ``[q_proj, v_proj]``, Phi-3 ``[qkv_proj]``, GPT-2 ``[c_attn]``
(a transformers ``Conv1D``), GPT-NeoX/Falcon/Bloom ``[query_key_value]``. These are the attention projections
that Hu et al. 2021 (LoRA, §7.1) adapt and that peft's own ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``
lists per model type.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dplora.contract.choices import Sharding
from dplora.engine import distributed
from dplora.engine.specs import LoraSpec, ModelBuild, ModelSpec
from dplora.errors import BadInputError

AUTO = "auto"
ALL_LINEAR = "all-linear"  # peft's own spelling (peft.utils.constants.INCLUDE_LINEAR_LAYERS_SHORTHAND)

AUTO_CANDIDATES: tuple[tuple[str, ...], ...] = (
    ("q_proj", "v_proj"),  # Llama, Qwen2/3, Mistral, Gemma 1-3, Phi-1/2, OPT
    ("qkv_proj",),  # Phi-3
    ("c_attn",),  # GPT-2 (Conv1D)
    ("query_key_value",),  # GPT-NeoX, Falcon, Bloom
    ("Wqkv",),  # MPT
    ("query", "value"),  # BERT-style
    ("q", "v"),  # T5-style
)

MAX_LIBRARY_CHARS = 300
# known-harmless library warnings: dropped, never shown
_HARMLESS = (
    re.compile(r"fan_in_fan_out is set to (False|True)"),  # peft sets it itself for Conv1D targets
    re.compile(r"`is_gradient_checkpointing` is deprecated"),  # transformers 5 rename, read by peft
    re.compile(r"Full backward hook is firing"),  # Opacus hooks on a frozen base (inputs need no grad)
    # torch 2.13's own torch.utils.mkldnn, imported through inductor when peft >= 0.22 imports bitsandbytes lazily
    # inside the LoRA wrap: a fact of the install, not of the model or the data
    re.compile(r"`torch\.jit\.script_method` is deprecated"),
)


def _is_linear(module) -> bool:
    import torch

    if isinstance(module, torch.nn.Linear):
        return True
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - transformers always ships it
        return False
    return isinstance(module, Conv1D)


def _output_layer_names(model) -> set[str]:
    names = {"lm_head"}
    get = getattr(model, "get_output_embeddings", None)
    out = get() if callable(get) else None
    if out is not None:
        names |= {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if m is out and n}
    return names


def linear_module_names(model) -> list[str]:
    """The leaf names of the model's linear modules (``nn.Linear`` and transformers ``Conv1D``), output layer excluded.

    Args:
        model: a loaded ``transformers`` model (not yet wrapped by peft).
    Returns:
        Sorted unique leaf names, e.g. ``["down_proj", "gate_proj", "k_proj", ...]``.
    Source: the names peft's ``target_modules`` matches by suffix (peft ``check_target_module_exists``).
    """
    skip = _output_layer_names(model)
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if n and _is_linear(m)} - skip)


def _valid_names_line(model) -> str:
    names = linear_module_names(model)
    return f"valid linear module names of this model: [{', '.join(names)}], or `all-linear` or `auto`"


def resolve_target_modules(model, requested) -> list[str] | str:
    """The ``target_modules`` to hand to peft for ``lora.target_modules``.

    Args:
        model: the loaded base model (before ``get_peft_model``).
        requested: ``"auto"``, ``"all-linear"`` or a tuple of module names (leaf names or dotted suffixes).
    Returns:
        ``auto``: the first :data:`AUTO_CANDIDATES` group present, as a list; ``all-linear``: the string as is
        (peft resolves it); a list: the list, each name checked.
    Raises:
        BadInputError: no candidate group fits (``auto``), or a listed name is not a linear module of the model
            (an unknown name, a block such as ``mlp``, an embedding, the output layer): one line listing the
            valid names.
    """
    if requested == ALL_LINEAR:
        return ALL_LINEAR
    names = set(linear_module_names(model))
    if requested == AUTO:
        for group in AUTO_CANDIDATES:
            if all(n in names for n in group):
                return list(group)
        raise BadInputError(
            f"lora.target_modules=auto: no known attention projection in this model; give the names, "
            f"{_valid_names_line(model)}"
        )
    skip = _output_layer_names(model)  # the output layer is never adapted (as peft's all-linear)
    linear_paths = {n for n, m in model.named_modules() if n and _is_linear(m) and n.rsplit(".", 1)[-1] not in skip}
    bad = [t for t in requested if t not in names and not any(p == t or p.endswith("." + t) for p in linear_paths)]
    if bad:
        raise BadInputError(
            f"lora.target_modules: {', '.join(repr(b) for b in bad)} not a linear module of this model; "
            f"{_valid_names_line(model)}"
        )
    return list(requested)


def adapted_module_names(peft_model) -> list[str]:
    """The modules that hold LoRA adapters in a peft model (what ``auto``/``all-linear``/a list resolved to).

    A leaf name (``q_proj``) stands for every module of that name, as in peft's ``target_modules``; when only some
    modules of a leaf name are adapted (``[layers.0.self_attn.q_proj]``), their full paths are listed instead, so
    the record never claims more layers than were trained.

    Args:
        peft_model: a ``peft.PeftModel`` (possibly inside Opacus's ``GradSampleModule``).
    Returns:
        Sorted unique names, e.g. ``["q_proj", "v_proj"]`` or ``["model.layers.0.self_attn.q_proj"]``.
    Source: peft ``BaseTunerLayer`` (every LoRA layer subclasses it).
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    prefix = "base_model.model."
    modules = [(n.split(prefix, 1)[-1], m) for n, m in peft_model.named_modules() if n]
    adapted = {path for path, m in modules if isinstance(m, BaseTunerLayer)}
    leaves = {path.rsplit(".", 1)[-1] for path in adapted}
    same_leaf = {  # every module, adapted or not, that a leaf name in target_modules would match
        path for path, m in modules if path.rsplit(".", 1)[-1] in leaves and (path in adapted or _is_linear(m))
    }
    names = []
    for leaf in leaves:
        ours = {p for p in adapted if p.rsplit(".", 1)[-1] == leaf}
        theirs = {p for p in same_leaf if p.rsplit(".", 1)[-1] == leaf}
        names += [leaf] if ours == theirs else sorted(ours)
    return sorted(names)


def library_error_line(err: BaseException, limit: int = MAX_LIBRARY_CHARS) -> str:
    """A library's error message whole on one line: lines joined, whitespace collapsed, cut at ``limit`` chars."""
    text = " ".join(str(err).split()) or err.__class__.__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextmanager
def library_warnings(log: Callable[[str], None]) -> Iterator[None]:
    """Capture Python warnings raised inside (model load, LoRA wrap); afterwards log one ``note:`` line per
    distinct warning (first line, at most 160 characters), known-harmless ones dropped."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    seen: set[str] = set()
    for w in caught:
        text = " ".join(str(w.message).split())
        if not text or any(p.search(text) for p in _HARMLESS):
            continue
        short = text if len(text) <= 160 else text[:157] + "..."
        if short not in seen:
            seen.add(short)
            log(f"note: {w.category.__name__} from a library: {short}")


def setup_model(
    model: ModelSpec,
    lora: LoraSpec,
    training: ModelBuild,
    device,
    dtype: str,
    allow_tf32: bool,
    log,
    world: distributed.World = distributed.SINGLE,
):
    """Load the base model in ``dtype`` on ``device``, then wrap it with fp32 LoRA adapters (peft).

    ``training.sharding: fsdp`` loads the base sharded 1/W over ``world``'s ranks
    (:func:`dplora.engine.sharding.load_sharded_base`) before peft wraps it, so the LoRA tensors stay whole.

    ``model``, ``lora`` and ``training`` name the base model; r, alpha and targets; the seed of the LoRA
    initialisation, gradient checkpointing and sharding (:mod:`dplora.engine.specs`).

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


def check_pad_embedding(model, tokenizer) -> None:
    """Refuse a base model whose padding token's input embedding is not finite (a fact about the PUBLIC model).

    Records share a physical batch right-padded to its longest record. Attention gives the pad positions weight
    0, but 0 · NaN is NaN: a NaN pad embedding would turn a shorter record's loss and gradient NaN whenever a longer
    neighbour shares its batch, so one unit's length would decide whether another unit counts.

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
        # written): a refusal on that rank alone left the others hanging in the next collective
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
