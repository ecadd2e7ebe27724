"""Fail fast: the contract's model checked without loading it, in about a second (``dplora validate --check-files``,
and the start of ``dplora train``, before the data is read or σ calibrated): the folder's ``config.json``, weight
files and tokenizer, a .gguf file's magic bytes, the packaged model's package, a Hub id's cached snapshot. Only
structure is read; the model is public.
"""

from __future__ import annotations

import json
from pathlib import Path

from dplora.contract.spec import PACKAGED_MODELS
from dplora.data.precheck import _first_sentence
from dplora.engine.specs import ModelSpec
from dplora.errors import BadInputError

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")
SLOW_TOKENIZER_FILES = (("vocab.json", "merges.txt"), ("tokenizer.model",), ("spiece.model",), ("vocab.txt",))


def _folder_checks(folder: Path, label: str) -> tuple[str, bool]:
    """(OK line, has a chat template) for a Hugging Face folder: config.json, weights, tokenizer."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInputError(f"{label}: {folder} has no config.json: not a Hugging Face model folder") from None
    except (OSError, ValueError) as err:
        raise BadInputError(f"{label}: {folder}/config.json cannot be read ({_first_sentence(err)})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise BadInputError(f"{label}: {folder}/config.json names no model_type: not a transformers model config")
    weights = sorted({p.name for pat in WEIGHT_PATTERNS for p in folder.glob(pat)})
    if not weights:
        raise BadInputError(f"{label}: {folder} has no weight files (*.safetensors or pytorch_model*.bin)")
    tokenizer_file = folder / "tokenizer.json"
    if tokenizer_file.is_file():
        from tokenizers import Tokenizer  # the Rust library: no torch

        try:
            Tokenizer.from_file(str(tokenizer_file))
        except Exception as err:  # noqa: BLE001 - any parse failure of the file is the same refusal
            raise BadInputError(f"{label}: {tokenizer_file} cannot be read ({_first_sentence(err)})") from None
        tokenizer = "tokenizer.json"
    else:
        found = next((files for files in SLOW_TOKENIZER_FILES if all((folder / f).is_file() for f in files)), None)
        if found is None:
            raise BadInputError(
                f"{label}: {folder} has no tokenizer (tokenizer.json, or vocab.json + merges.txt, tokenizer.model)"
            )
        tokenizer = " + ".join(found)
    template = (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file()
    try:
        tok_config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = template or bool(isinstance(tok_config, dict) and tok_config.get("chat_template"))
    except (OSError, ValueError):
        pass
    line = (
        f"OK  model: {folder} (model_type {config['model_type']}; {len(weights)} weight file(s); {tokenizer}; "
        f"{'a' if template else 'no'} chat template)"
    )
    return line, template


def check_model_files(section: ModelSpec) -> tuple[str, bool | None]:
    """Check the contract's model without loading it: the folder's config.json, weight files and tokenizer, a
    .gguf file's magic bytes, the packaged model's package, a Hub id's cached snapshot.

    Returns:
        (one ``OK  model: ...`` line, whether the tokenizer has a chat template; None when not known before the
        model is loaded: a .gguf file, or the packaged model not yet converted).
    Raises:
        BadInputError: a missing folder or file (a Hub id in ``model.path`` points to ``model.name``), an unreadable
            config.json or tokenizer.json, no weights, no tokenizer, a file that is not GGUF.
    """
    from dplora.engine.model import (
        SMOLLM2_GGUF,
        check_model_cache,
        hub_snapshot,
        packaged_gguf,
        resolve_model,
        smollm2_cache,
    )

    if section.name in PACKAGED_MODELS:
        packaged_gguf()
        check_model_cache(section)
        converted = smollm2_cache()
        if (converted / "config.json").is_file():
            return _folder_checks(converted, f"model.name={section.name}")
        return f"OK  model: {section.name} ({SMOLLM2_GGUF} installed; converted on first use)", None
    if section.name is not None:
        return _folder_checks(hub_snapshot(section.name, section.revision), f"model.name={section.name}")
    folder, gguf = resolve_model(section)  # a missing path, a folder without config.json, a Hub id
    if gguf is None:
        return _folder_checks(folder, f"model.path={section.path}")
    path = folder / gguf
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as err:
        raise BadInputError(f"model.path={section.path}: cannot read {path} ({err.strerror or err})") from None
    if magic != b"GGUF":
        raise BadInputError(f"model.path={section.path}: {path} does not start with the GGUF magic bytes: not GGUF")
    return f"OK  model: {path} (a GGUF file)", None
