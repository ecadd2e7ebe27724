"""Finding a release's data and base model when the release has moved (``eval``, ``synth``, ``generate``, ``audit``).

A run's ``contract.yaml`` keeps ``data.path``, ``data.eval_path`` and ``model.path`` as they were typed at training,
often relative to the folder training ran in. :func:`locate_inputs` finds each file the command needs, in this
order:

1. the file the caller gives (``--data FILE``, ``--model PATH``), checked against the signed record's digests;
2. the contract's path as written: an absolute path as is, a relative one from the current directory (as before);
3. a relative path from the run folder's parent (training usually ran where the run folder sits), checked against
   the record's digests as a given file is, since it is a guess.

A file that is not found is one line naming the option to give; a file whose digest differs from the record's is
refused in one line (exit 2), naming the file given, never its content. The record's data digest is keyed
(HMAC-SHA256 with a salt, :func:`dplora.release.envelope.data_digest_entry`): checking a file needs the data
owner's key (``--data-key`` or ``$DPLORA_DATA_KEY``); a record without a data digest (trained without a key) has
nothing to check, which is said in one line. The base model is checked file by file against ``base_model.files``
(:func:`dplora.release.verify.check_base_model`). The located paths replace the contract's in the returned run, so
the rest of a command reads them as before; nothing here is written anywhere, so no path or file name of the data
enters a record, a card or a ``--json`` document.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dplora.errors import BadInputError, VerificationError, excerpt
from dplora.release.read import ReleasedRun, read_run, read_statement

TRAINED_WHERE = "the path in the run's contract.yaml"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReleaseInputs:
    """What the caller gives for a moved release: ``--data FILE``, ``--model PATH`` and ``--data-key PATH`` (None:
    not given; the key then comes from ``$DPLORA_DATA_KEY`` where one is needed)."""

    data: Path | None = None
    model: Path | None = None
    data_key: Path | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Found:
    path: Path
    guessed: bool  # found beside the run folder, not where the contract's path points from here


def _shown(path: str, limit: int = 200) -> str:
    """A path as typed for a one-line message; quoted and cut when it is long or holds control characters."""
    return path if path.isprintable() and len(path) <= limit else excerpt(path, limit)


def _where(written: str) -> str:
    """Where a contract path was looked for, in words (for the not-found line)."""
    if Path(written).expanduser().is_absolute():
        return TRAINED_WHERE
    return f"{TRAINED_WHERE}, relative to where it was trained"


def _find(written: str, folder: Path, exists) -> _Found | None:
    """The contract's path as written (from the current directory), else relative to the run folder's parent."""
    path = Path(written).expanduser()
    if exists(path):
        return _Found(path=path, guessed=False)
    if not path.is_absolute():
        beside = folder.resolve().parent / path
        if exists(beside):
            return _Found(path=beside, guessed=True)
    return None


def _predicate(run: ReleasedRun) -> dict:
    """The record, read without verifying the signature (``synth`` and ``generate`` verify it themselves; ``eval``
    is post-processing whose numbers are not signed): the digests a given file is checked against."""
    from dplora.release.envelope import RELEASE_FILENAME

    statement = read_statement(run.folder / RELEASE_FILENAME) or {}
    predicate = statement.get("predicate")
    return predicate if isinstance(predicate, dict) else {}


def _data_digest(predicate: dict) -> dict | None:
    data = predicate.get("data")
    digest = data.get("digest") if isinstance(data, dict) else None
    return digest if isinstance(digest, dict) and digest.get("files") else None


def check_data(run: ReleasedRun, path: Path, data_key: Path | None, *, option: str, log=print) -> None:
    """Check a data file that stands in for the run's ``data.path`` against the release record's ``data.digest``.

    Args:
        run: the release (:func:`dplora.release.read.read_run`); its record is read without checking the signature.
        path: the file given (``--data``) or found beside the run folder.
        data_key: ``--data-key`` (None: ``$DPLORA_DATA_KEY``, :func:`dplora.release.envelope.load_data_key`).
        option: how the refusal names the file (``--data FILE``; a guessed file names where it was found).
        log: one line when the record holds no data digest to check against.
    Raises:
        BadInputError: a keyed digest and no key, an unreadable key or file, or a file whose digest differs from
            the record's (exit 2; one line naming ``option``, never the file's content).
    """
    from dplora.data.digest import sha256_file
    from dplora.release.envelope import load_data_key
    from dplora.release.verify import check_data_file

    predicate = _predicate(run)
    digest = _data_digest(predicate)
    trained = Path(run.contract.data.path).name  # the name the record keys the digest by
    if digest is None:
        log(f"note: the release records no data digest (trained without a data key): {option} is not checked")
        return
    if digest.get("keyed") is not True:  # a plain sha256 entry: checked without a key
        recorded = str((digest.get("files") or {}).get(trained, "")).lower()
        if sha256_file(path) != recorded:
            raise BadInputError(f"{option}: the file does not match the release's data digest (another file)")
        return
    key = load_data_key(data_key)
    if key is None:
        raise BadInputError(
            f"{option}: the release's data digest is keyed: give --data-key PATH or set $DPLORA_DATA_KEY (the data "
            "owner's key) to check the file against it"
        )
    try:
        check_data_file(predicate, path, key, name=trained)
    except VerificationError:
        raise BadInputError(
            f"{option}: the file does not match the release's data digest (another file, or another data key)"
        ) from None


def check_model(run: ReleasedRun, path: Path, *, option: str, log=print) -> None:
    """Check a base model that stands in for the run's ``model.path`` against the record's ``base_model.files``.

    Args:
        run: the release; its record is read without checking the signature.
        path: the folder or ``.gguf`` file given (``--model``) or found beside the run folder.
        option: how the refusal names it.
        log: one line when the record holds no base-model digests (an older release).
    Raises:
        BadInputError: a missing or different file (exit 2, one line naming ``option`` and the file that differs).
    """
    from dplora.release.verify import check_base_model

    predicate = _predicate(run)
    base = predicate.get("base_model")
    if not isinstance(base, dict) or not base.get("files"):
        log(f"note: the release records no base-model digests (an older release): {option} is not checked")
        return
    try:
        check_base_model(predicate, path)
    except VerificationError as err:
        raise BadInputError(f"{option}: does not match the release's base model ({err})") from None
    if path.is_dir():  # a file that transformers would read and training did not (a new chat_template.jinja)
        from dplora.engine.basefiles import base_model_file_names

        extra = [name for name in base_model_file_names(path) if name not in base["files"]]
        if extra:
            raise BadInputError(
                f"{option}: does not match the release's base model ({_shown(extra[0], 80)} is not a file it "
                f"was trained with{f', nor {len(extra) - 1} more' if len(extra) > 1 else ''})"
            )


def private_data_paths(run: ReleasedRun) -> dict[str, str]:
    """Every place the run's private data files may be found from here, for identity guards (a label set or prompt
    file that must never be the data): ``data.path`` and ``data.eval_path`` as written (from the current
    directory) and, for a relative one, from the run folder's parent, where :func:`locate_inputs` looks too.

    Returns:
        {description: path}; paths only, nothing is read.
    """
    out: dict[str, str] = {}
    for key in ("path", "eval_path"):
        written = getattr(run.contract.data, key)
        if written is None:
            continue
        out[f"data.{key}"] = written
        if not Path(written).expanduser().is_absolute():
            out[f"data.{key}, beside the run folder"] = str(run.folder.resolve().parent / written)
    return out


def _rebind(run: ReleasedRun, *, data: dict, model: dict) -> ReleasedRun:
    contract = run.contract
    update = {}
    if data:
        update["data"] = contract.data.model_copy(update=data)
    if model:
        update["model"] = contract.model.model_copy(update=model)
    return dataclasses.replace(run, contract=contract.model_copy(update=update)) if update else run


def locate_inputs(
    target: Path | ReleasedRun,
    inputs: ReleaseInputs = ReleaseInputs(),
    *,
    data: bool,
    model: bool = True,
    eval_file: bool = False,
    data_for: str | None = None,
    log=print,
) -> ReleasedRun:
    """The release ``target`` with the data and base-model paths its command reads found, wherever it now is.

    Each needed file is the caller's (checked against the record's digests), else the contract's path from the
    current directory, else (a relative path) from the run folder's parent, checked as a given file is. See the
    module docstring for the order and the checks.

    Args:
        target: a run folder, its contract, or a run already read (:func:`dplora.release.read.read_run`).
        inputs: ``--data``, ``--model`` and ``--data-key`` as given.
        data: the command reads the training data (``data.path``): eval's split, synth's verbatim check.
        model: the command loads the base model (``model.path``; a packaged or Hub model is found by name).
        eval_file: the command reads the contract's held-out file (``data.eval_path``; no digest is recorded for it,
            so it is found but not checked; ``--eval-path`` replaces it).
        data_for: why the command reads the data, said before a data-not-found line (synth's verbatim check).
        log: the one-line sink of notes (a record with no digest to check against).
    Returns:
        :class:`dplora.release.read.ReleasedRun` whose contract names the located files (the run's own
        ``contract.yaml`` and record are unchanged).
    Raises:
        BadInputError: a needed file not found (one line naming the option to give), a given path that is not a
            file or folder, ``--data``/``--model`` where the command or the run does not read one, or a file whose
            digest differs from the record's (exit 2).
    """
    run = target if isinstance(target, ReleasedRun) else read_run(target)
    data_update: dict = {}
    model_update: dict = {}
    if inputs.data is not None and not data:
        raise BadInputError("--data: this command reads no training data here (the held-out set is another file)")
    if data:
        data_update["path"] = str(_data_path(run, inputs, log, data_for))
    if eval_file and run.contract.data.eval_path is not None:
        written = run.contract.data.eval_path
        found = _find(written, run.folder, Path.is_file)
        if found is None:
            raise BadInputError(
                f"held-out file not found: {_shown(written)} ({_where(written)}); give --eval-path FILE"
            )
        data_update["eval_path"] = str(found.path)
    if inputs.model is not None and not model:
        raise BadInputError("--model: this command loads no base model")
    if model and (path := _model_path(run, inputs, log)) is not None:
        model_update["path"] = str(path)
    return _rebind(run, data=data_update, model=model_update)


def _data_path(run: ReleasedRun, inputs: ReleaseInputs, log, data_for: str | None = None) -> Path:
    """``--data`` checked, else the contract's ``data.path`` found (and checked when found beside the run folder)."""
    if inputs.data is not None:
        given = Path(inputs.data).expanduser()
        if not given.is_file():
            raise BadInputError(f"--data {_shown(str(inputs.data))}: no such file")
        check_data(run, given, inputs.data_key, option=f"--data {_shown(str(inputs.data))}", log=log)
        return given
    written = run.contract.data.path
    found = _find(written, run.folder, Path.is_file)
    if found is None:
        why = f"{data_for}: " if data_for else ""
        raise BadInputError(f"{why}data file not found: {_shown(written)} ({_where(written)}); give --data FILE")
    _check_found(run, found, inputs, "data", log)
    return found.path


def _check_found(run: ReleasedRun, found: _Found, inputs: ReleaseInputs, kind: str, log) -> None:
    """A file the command found (not given) is checked against the record whenever it can be: any file the
    contract's path now points at may have been replaced since training (a held-out split and an attached audit
    computed on other rows would be wrong, the audit signed). A base model is always checkable (its files'
    sha256); data under a plain digest too; data under a keyed digest only with the owner's key, and a file found
    beside the run folder that cannot be checked is said so in one line (nothing was given, so it is not refused)."""
    from dplora.release.envelope import load_data_key

    if found.guessed:
        where = f"{kind} found beside the run folder at {_shown(str(found.path))}"
    else:
        where = f"{kind} at {_shown(str(found.path))} ({TRAINED_WHERE})"
    option = "--data FILE" if kind == "data" else "--model PATH"
    try:
        if kind == "model":
            check_model(run, found.path, option=where, log=lambda _line: None)
            return
        digest = _data_digest(_predicate(run))
        if digest is None:
            return  # nothing recorded to check against (trained without a data digest), as before
        if digest.get("keyed") is True and load_data_key(inputs.data_key) is None:
            if found.guessed:
                log(
                    f"note: the {where} is not checked: the release's data digest is keyed; give --data-key PATH or "
                    "set $DPLORA_DATA_KEY to check it"
                )
            return
        check_data(run, found.path, inputs.data_key, option=where, log=lambda _line: None)
    except BadInputError as err:
        raise BadInputError(f"{err}; give {option}") from None


def _model_path(run: ReleasedRun, inputs: ReleaseInputs, log) -> Path | None:
    """``--model`` checked, else the contract's ``model.path`` found; None for a packaged or Hub model (by name)."""
    section = run.contract.model
    if section.path is None:
        if inputs.model is not None:
            raise BadInputError(
                f"--model: this run's base model is model.name={section.name}, found by name (the packaged model or "
                "the local Hugging Face cache); --model stands in for a model.path only"
            )
        return None
    if inputs.model is not None:
        given = Path(inputs.model).expanduser()
        if not (given.is_file() or given.is_dir()):
            raise BadInputError(f"--model {_shown(str(inputs.model))}: no such file or folder")
        check_model(run, given, option=f"--model {_shown(str(inputs.model))}", log=log)
        return given
    written = section.path
    found = _find(written, run.folder, lambda p: p.is_file() or p.is_dir())
    if found is None:
        raise BadInputError(f"model not found: model.path={_shown(written)} ({_where(written)}); give --model PATH")
    _check_found(run, found, inputs, "model", log)
    return found.path
