"""Reading a finished run folder for post-processing (``dplora eval``, ``dplora generate``).

A run folder holds ``adapter/``, ``contract.yaml`` and ``release.dsse.json``; a failed or unfinished run has no
release and is refused. Whether the run is differentially private comes from both its contract
(``privacy.enabled``) and its release's predicate type, read without checking the signature (``dplora verify``
does that): either one saying "non-private" makes it a control. Nothing here spends privacy budget: using
released adapters is post-processing.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import warnings
from pathlib import Path

from dplora.contract.loader import load_contract
from dplora.contract.spec import Contract
from dplora.errors import BadInputError

ADAPTER_DIR = "adapter"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReleasedRun:
    """A finished run: its folder, the contract it trained under, and whether it is differentially private."""

    folder: Path
    contract: Contract
    differentially_private: bool


def resolve_run_folder(target: Path, overrides: list[str] | None = None) -> Path:
    """The run folder for ``RUN_OR_CONFIG``: the folder itself, or a contract's ``training.output_dir``.

    Raises:
        BadInputError: neither a folder nor a readable contract.
    """
    target = Path(target)
    if target.is_dir():
        return target
    if target.is_file():
        return Path(load_contract(target, overrides or []).training.output_dir)
    raise BadInputError(f"{target}: no such run folder or contract file")


def read_statement(envelope_path: Path) -> dict | None:
    """The in-toto statement inside ``envelope_path`` (``release.dsse.json``), read WITHOUT verifying its
    signature: for metadata only (e.g. the record's ``started_at``), never for a trust decision. None if unreadable.
    """
    return _statement(envelope_path)


def _statement(envelope_path: Path) -> dict | None:
    """The release's in-toto statement, read without verifying the signature (None if unreadable)."""
    try:
        envelope = json.loads(envelope_path.read_text(encoding="utf-8"))
        statement = json.loads(base64.b64decode(envelope["payload"], validate=True))
        return statement if isinstance(statement, dict) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        return None


def _predicate_type(envelope_path: Path) -> str | None:
    """The release's predicateType, read without verifying the signature (None if unreadable)."""
    statement = _statement(envelope_path)
    return statement.get("predicateType") if statement is not None else None


def released_tokenization(run: ReleasedRun) -> dict | None:
    """The release record's ``tokenization`` entry (:func:`dplora.data.chat.tokenization_entry`), or None.

    Read without verifying the signature: callers that rely on it verify the release first
    (:func:`dplora.release.verify.verify_release`). None for a record written before the entry existed.
    """
    from dplora.release.envelope import RELEASE_FILENAME

    statement = _statement(run.folder / RELEASE_FILENAME)
    predicate = statement.get("predicate") if statement is not None else None
    entry = predicate.get("tokenization") if isinstance(predicate, dict) else None
    return entry if isinstance(entry, dict) else None


def read_run(target: Path | ReleasedRun, overrides: list[str] | None = None) -> ReleasedRun:
    """Read the run folder named by ``target`` (a run folder or its contract).

    Args:
        target: a run folder or its contract; a run already read (e.g. with its data and base model located for a
            moved release, :func:`dplora.release.locate.locate_inputs`) is returned as it is.
        overrides: dotted overrides for a contract ``target``.
    Returns:
        :class:`ReleasedRun`; the contract is the run's own ``contract.yaml`` (the one its release covers).

    Raises:
        BadInputError: no folder, no release (a failed or unfinished run), no adapter or a bad contract.
    """
    from dplora.release.envelope import PREDICATE_TYPE, RELEASE_FILENAME

    if isinstance(target, ReleasedRun):
        return target
    folder = resolve_run_folder(target, overrides)
    if not folder.is_dir():
        raise BadInputError(f"run folder {folder} does not exist: train it first")
    if not (folder / RELEASE_FILENAME).is_file():
        raise BadInputError(f"{folder} has no {RELEASE_FILENAME}: a failed or unfinished run has no release")
    if not (folder / ADAPTER_DIR / "adapter_config.json").is_file():
        raise BadInputError(f"{folder} has no {ADAPTER_DIR}/adapter_config.json")
    contract = load_contract(folder / "contract.yaml")
    private = contract.privacy.enabled and _predicate_type(folder / RELEASE_FILENAME) == PREDICATE_TYPE
    return ReleasedRun(folder=folder, contract=contract, differentially_private=private)


def load_adapter_model(run: ReleasedRun, *, threads: int | None = None, log=print):
    """Base model + the run's adapters, in eval mode, on the training device and base dtype.

    Returns:
        (peft model, tokenizer, device).

    Raises:
        BadInputError: the base model or the adapters cannot be loaded.
    """
    import torch
    from peft import PeftModel

    from dplora.engine.model import load_base_model, resolve_precision, select_device
    from dplora.engine.runtime import free_threads

    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")  # transformers 5, as train
    torch.set_num_threads(threads or run.contract.training.threads or free_threads())
    device = select_device()
    dtype, allow_tf32 = resolve_precision(run.contract.model, device)
    base, tokenizer = load_base_model(run.contract.model, device, dtype, allow_tf32, log)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Unexpected keyword arguments")  # the control's privacy note
        try:
            model = PeftModel.from_pretrained(base, run.folder / ADAPTER_DIR, is_trainable=False)
        except (OSError, ValueError, KeyError, RuntimeError) as err:
            raise BadInputError(
                f"cannot load the adapters in {run.folder / ADAPTER_DIR}: {err.__class__.__name__}"
            ) from None
    model.eval()
    return model, tokenizer, device
