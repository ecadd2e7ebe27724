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
