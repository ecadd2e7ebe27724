"""The output folder of ``dplora train``: which folders a run may write, replace or delete.

A run writes ``<output_dir>.partial/`` (marked with :data:`PARTIAL_MARKER` from its first byte), renames it to
``<output_dir>`` only when the release is signed, and holds ``<output_dir>.lock`` meanwhile. Numbers computed on
the private data and not covered by ε (per-step realised batch sizes, losses, step times, a private held-out
evaluation) are written to ``<output_dir>.partial/private/`` and published beside the release as
``<output_dir>.private/``, never inside it: the release folder holds only the adapters, the card, the contract
and the signed files. ``--overwrite``
replaces only a folder that a previous dplora run wrote; nothing here ever deletes a folder dplora did not
write. Every refusal is a :class:`~dplora.errors.BadInputError` (exit 2) raised before any work.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

from dplora import atomic
from dplora.errors import BadInputError, excerpt
from dplora.run.execution import utc_now

RELEASE_FILENAME = "release.dsse.json"  # same names as in dplora.release.envelope (no import: leaf module)
SIGSTORE_FILENAME = "release.sigstore.json"
PARTIAL_MARKER = ".dplora-partial"
FAILED_FILENAME = "FAILED.json"
# Top-level entries a finished run's folder may hold; anything else was put there by someone else. A release
# written before the private folder existed also held metrics.jsonl: --overwrite still replaces it.
RUN_ENTRIES = frozenset({"adapter", "contract.yaml", "metrics.jsonl", RELEASE_FILENAME, SIGSTORE_FILENAME})
CHECKPOINT_FILENAME = "resume.safetensors"  # same name as dplora.run.checkpoint.CHECKPOINT_FILENAME
PRIVATE_SUBDIR = "private"  # inside <output_dir>.partial while the run writes; <output_dir>.private once published
METRICS_FILENAME = "metrics.jsonl"  # the per-step log, in the private folder
PRIVATE_NOTICE = "DO_NOT_SHIP.txt"  # marks a private folder dplora wrote, and says what it is
PRIVATE_NOTICE_TEXT = (
    "Written by dplora train. This folder holds numbers computed on the private training data that the DP\n"
    "guarantee does NOT cover: each step's realised number of sampled units and records, training loss and\n"
    "wall time, and any evaluation on a private held-out set. Keep it local: never ship or publish it with the\n"
    "release folder beside it.\n"
)
PRIVATE_ENTRIES = frozenset(
    {PRIVATE_NOTICE, METRICS_FILENAME, "train.log", "report.json", "tensorboard", "eval.json", "synth"}
)
PARTIAL_ENTRIES = RUN_ENTRIES | {PARTIAL_MARKER, FAILED_FILENAME, CHECKPOINT_FILENAME, PRIVATE_SUBDIR}


def output_path(output_dir: str | Path) -> Path:
    """``training.output_dir`` normalised lexically (``a/..`` → ``.``), so sibling names are well defined."""
    return Path(os.path.normpath(os.fspath(output_dir)))


def staging_path(out: Path) -> Path:
    """``<output_dir>.partial``: where a run writes until its release is signed."""
    return out.with_name(out.name + ".partial")


def private_path(out: Path) -> Path:
    """``<output_dir>.private``: the published run's private, not-covered numbers (never part of the release)."""
    return out.with_name(out.name + ".private")


def private_staging(staging: Path) -> Path:
    """``<output_dir>.partial/private``: where the run writes its private numbers (created with its notice)."""
    folder = Path(staging) / PRIVATE_SUBDIR
    if not folder.is_dir():
        folder.mkdir()
        atomic.write_text(folder / PRIVATE_NOTICE, PRIVATE_NOTICE_TEXT)
    return folder


def private_folder(out: Path) -> Path:
    """``<output_dir>.private`` of a published run, created with its notice if missing (post-release commands put
    their private diagnostics there: ``eval``'s numbers on a private held-out set, ``synth``'s memorisation check)."""
    folder = private_path(Path(out))
    if not folder.is_dir():
        folder.mkdir(parents=True)
    if not (folder / PRIVATE_NOTICE).is_file():
        atomic.write_text(folder / PRIVATE_NOTICE, PRIVATE_NOTICE_TEXT)
    return folder


def lock_path(out: Path) -> Path:
    """``<output_dir>.lock``: held (flock) for the whole run."""
    return out.with_name(out.name + ".lock")


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_output_dir(output_dir: str | Path, *, overwrite: bool, protected: Sequence[tuple[str, Path]]) -> Path:
    """Refuse an output folder that a run must not write, replace or delete; return it normalised.

    Refused, whatever ``overwrite`` says: a path that is a file; a folder that is or contains the working
    directory or any ``protected`` path (the contract, the data, the model, a key, the ledger); a
    ``<output_dir>.partial`` or ``<output_dir>.lock`` that dplora did not write. Without ``overwrite`` a
    non-empty folder is refused; with it, only a folder holding a previous run's release and nothing else.

    Args:
        output_dir: ``training.output_dir`` as written (relative paths resolve against the working directory).
        overwrite: ``--overwrite`` was given.
        protected: ``(what, path)`` pairs the output folder must not hold, e.g. ``("the contract", cfg)``.

    Returns:
        The normalised output folder path (see :func:`output_path`).

    Raises:
        BadInputError: one line naming the folder and the reason (exit 2).
    """
    out = output_path(output_dir)
    where = f"training.output_dir={os.fspath(output_dir)!r}"
    real = out.resolve()
    inputs = [("the working directory", Path.cwd()), *protected]
    siblings = (staging_path(real), private_path(real)) if real.name else ()  # "/" holds the working directory
    for folder in (real, *siblings):
        for what, path in inputs:
            if _is_within(Path(path).resolve(), folder):
                detail = "" if what == "the working directory" else f" ({path})"
                raise BadInputError(f"{where} is or contains {what}{detail}; give the run a folder of its own")
    if out.exists() and not out.is_dir():
        raise BadInputError(f"output path {out} exists and is not a folder")
    entries = _entries(out)
    if entries and not overwrite:
        raise BadInputError(
            f"output folder {out} exists and is not empty; choose another folder, or pass --overwrite to replace "
            "a previous dplora run's output"
        )
    if entries and not _written_by_dplora(entries, RELEASE_FILENAME, RUN_ENTRIES):
        why = _why_foreign(entries, RELEASE_FILENAME, RUN_ENTRIES)
        raise BadInputError(
            f"--overwrite only replaces a folder a previous dplora run wrote; {out} {why}; choose another output_dir"
        )
    _check_staging(staging_path(out))
    _check_private(private_path(out), overwrite)
    lock = lock_path(out)
    if lock.exists() and not (lock.is_file() and lock.stat().st_size == 0):
        raise BadInputError(f"{lock} exists and was not written by dplora; move it away or choose another output_dir")
    parent = real.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise BadInputError(f"cannot create output folder {out}: {parent} is not a writable folder")
    return out


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _written_by_dplora(entries: list[str], sign: str, allowed: frozenset) -> bool:
    """A folder dplora wrote: it holds ``sign`` (the release or the marker) and nothing dplora does not write."""
    return sign in entries and all(e in allowed for e in entries)


def _why_foreign(entries: list[str], sign: str, allowed: frozenset) -> str:
    if sign not in entries:
        return f"has no {sign}"
    return f"also holds {next(e for e in entries if e not in allowed)!r}"


def _check_staging(staging: Path) -> None:
    if staging.exists() and not staging.is_dir():
        raise BadInputError(f"{staging} exists and is not a folder; move it away or choose another output_dir")
    entries = [e for e in _entries(staging) if not (e.startswith(".resume.") and e.endswith(".tmp"))]  # killed writes
    sign = PARTIAL_MARKER if PARTIAL_MARKER in entries else FAILED_FILENAME  # FAILED.json: runs before the marker
    if entries and not _written_by_dplora(entries, sign, PARTIAL_ENTRIES):
        why = _why_foreign(entries, sign, PARTIAL_ENTRIES)
        raise BadInputError(f"{staging} was not written by dplora ({why}); move it away or choose another output_dir")


def _check_private(private: Path, overwrite: bool) -> None:
    """``<output_dir>.private`` may be replaced only if dplora wrote it, and only with ``--overwrite``."""
    if private.exists() and not private.is_dir():
        raise BadInputError(f"{private} exists and is not a folder; move it away or choose another output_dir")
    entries = _entries(private)
    if entries and not _written_by_dplora(entries, PRIVATE_NOTICE, PRIVATE_ENTRIES):
        why = _why_foreign(entries, PRIVATE_NOTICE, PRIVATE_ENTRIES)
        raise BadInputError(f"{private} was not written by dplora ({why}); move it away or choose another output_dir")
    if entries and not overwrite:
        raise BadInputError(
            f"{private} holds a previous run's private numbers; move it away, or pass --overwrite to replace it"
        )


def missing_parents(out: Path) -> list[Path]:
    """The folders above ``out`` that do not exist yet, deepest first (a run that ends in exit 2 removes them)."""
    missing, parent = [], out.absolute().parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    return missing


def stamp_folders(folders: list[Path], when: str) -> None:
    """Set the mtime of each existing folder in ``folders`` (not their contents) to ``when`` (ISO 8601).

    The folders a run created above its output (:func:`missing_parents`) change when the release, the private and
    tracking folders and the lock come and go, so their real mtime is the run's end, which times the private run;
    ``when`` is the record's ``started_at``. A folder that existed before the run is the user's and is left alone.
    """
    import datetime as dt

    stamp = dt.datetime.fromisoformat(when).timestamp()
    for folder in folders:
        if folder.is_dir():
            os.utime(folder, (stamp, stamp))


def existing_parent(out: Path) -> Path:
    """The nearest folder above ``out`` that exists now (``out``'s parent, or the one above the folders
    :func:`missing_parents` lists)."""
    parent = Path(out).absolute().parent
    while not parent.exists():
        parent = parent.parent
    return parent


@dataclasses.dataclass(frozen=True)
class FolderTimes:
    """A folder's access and modification times (ns), read before a run and put back after it.

    A run adds and removes entries in the folder above its output (the lock, ``.partial/``, the release and
    ``.private/`` renamed into place), and each such change sets the folder's mtime to the wall clock: left alone,
    the folder's mtime is the run's end, and its distance from the record's ``started_at`` the private run's
    duration (a statistic of the data that no accountant charges). Restoring the times from before the run leaves
    that folder as the run found it.
    """

    path: Path
    atime_ns: int
    mtime_ns: int

    @classmethod
    def of(cls, folder: Path) -> FolderTimes | None:
        """The folder's times now, or None when it cannot be read (then nothing is restored)."""
        try:
            st = os.stat(folder)
        except OSError:
            return None
        return cls(Path(folder), st.st_atime_ns, st.st_mtime_ns)

    def restore(self) -> None:
        """Put the times back (a folder that went away or cannot be changed is left as it is)."""
        try:
            os.utime(self.path, ns=(self.atime_ns, self.mtime_ns))
        except OSError:
            pass


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove each folder if it is empty, deepest first; never a folder that holds anything."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def fresh_staging(out: Path) -> Path:
    """Create an empty, marked ``<output_dir>.partial`` (replacing a previous run's); returns its path.

    Raises:
        BadInputError: the folder exists and was not written by dplora.
    """
    staging = staging_path(out)
    _check_staging(staging)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        note = "written by dplora train; replaced by the next run into this folder\n"
        atomic.write_text(staging / PARTIAL_MARKER, note)
    except BaseException:  # an unmarked .partial would block the next run: remove it
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def publish(staging: Path, out: Path) -> Path | None:
    """Move a finished run into place: ``<output_dir>.partial`` → ``<output_dir>``, and its private numbers
    ``<output_dir>.partial/private`` → ``<output_dir>.private`` (first, so the release never holds them).

    An empty folder or a previous run's folder is renamed aside and deleted. If something else appeared in it
    during the run, it is kept, renamed ``<output_dir>.previous-<id>``, and that path is returned (else None).
    """
    (staging / PARTIAL_MARKER).unlink(missing_ok=True)
    _publish_private(staging / PRIVATE_SUBDIR, private_path(out))
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(out)
        return None
    tag = uuid.uuid4().hex[:12]
    entries = _entries(out)
    if not entries or _written_by_dplora(entries, RELEASE_FILENAME, RUN_ENTRIES):
        old = out.with_name(f".{out.name}.replaced-{tag}")
        out.rename(old)
        staging.rename(out)
        shutil.rmtree(old, ignore_errors=True)
        return None
    kept = out.with_name(f"{out.name}.previous-{tag}")
    out.rename(kept)
    staging.rename(out)
    return kept


def _publish_private(folder: Path, private: Path) -> None:
    """Rename the run's private folder to ``<output_dir>.private`` (a previous run's one, dplora's, is replaced)."""
    if not folder.is_dir():
        return
    if private.exists():
        old = private.with_name(f".{private.name}.replaced-{uuid.uuid4().hex[:12]}")
        private.rename(old)
        folder.rename(private)
        shutil.rmtree(old, ignore_errors=True)
        return
    private.parent.mkdir(parents=True, exist_ok=True)
    folder.rename(private)


def stamp(path: Path, when: str) -> None:
    """Set ``path``'s modification (and access) time to ``when`` (ISO 8601 UTC, the record's ``started_at``)."""
    import datetime as dt

    stamp_ = dt.datetime.fromisoformat(when).timestamp()
    os.utime(path, (stamp_, stamp_), follow_symlinks=False)


def fix_mtimes(folder: Path, when: str) -> None:
    """Set the modification (and access) time of ``folder`` and of everything in it to ``when``.

    A released file's mtime is public metadata: the real one is the run's end, and its distance from the start is
    the private run's duration. ``when`` is the record's ``started_at`` (ISO 8601 UTC, taken before the data is
    read), so the files carry a public time only. Missing folders are skipped.
    """
    import datetime as dt

    folder = Path(folder)
    if not folder.exists():
        return
    stamp = dt.datetime.fromisoformat(when).timestamp()
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in files + dirs:
            os.utime(Path(root) / name, (stamp, stamp), follow_symlinks=False)
    os.utime(folder, (stamp, stamp))


def prepare_output(output_dir: str, overwrite: bool, protected=()) -> tuple[Path, Path]:
    """The output folder (``training.output_dir``) and its ``.partial`` sibling; refusals follow
    :func:`check_output_dir`."""
    try:
        out = check_output_dir(output_dir, overwrite=overwrite, protected=protected)
    except OSError as err:  # a name too long for the file system, a permission denied on a parent
        where = f"training.output_dir={excerpt(output_dir, 200)}"
        raise BadInputError(f"{where}: {err.strerror or err.__class__.__name__}") from None
    return out, staging_path(out)


def lock_output(out: Path):
    """Hold an exclusive lock on ``<output_dir>.lock`` for the run (released when the process ends).

    Raises:
        BadInputError: another run is writing to the same output folder.
    """
    import fcntl

    path = lock_path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")  # noqa: SIM115 - held open for the whole run
    except OSError as err:
        raise BadInputError(f"cannot create {path}: {err.strerror}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise BadInputError(
            f"another dplora train is writing to {out}; wait for it or choose another output_dir"
        ) from None
    return handle


def metrics_path(staging: Path) -> Path:
    """The run's per-step log, ``<output_dir>.partial/private/metrics.jsonl`` (published as
    ``<output_dir>.private/metrics.jsonl``, beside the release and never in it): realised units and records,
    losses and step times are computed on private data and not covered by ε. A ``.partial`` folder from before
    the private folder existed has its ``metrics.jsonl`` moved there."""
    private = private_staging(staging)
    path = private / METRICS_FILENAME
    legacy = Path(staging) / METRICS_FILENAME
    if legacy.is_file() and not path.is_file():
        legacy.rename(path)
    return path


def open_metrics(staging: Path, resume_step: int, header: dict):
    """The private ``metrics.jsonl`` for appending: new with ``header``, or, when resuming, cut back to the
    checkpoint's step."""
    path = metrics_path(staging)
    if resume_step == 0 or not path.is_file():
        kept = [json.dumps(header)]
    else:  # only whole lines (ending in a newline) count: a line cut by a kill or a full disk is dropped
        kept = [ln for ln in atomic.complete_lines(path.read_text()) if _metrics_step(ln) <= resume_step]
        kept.append(json.dumps({"resumed_at_step": resume_step, "time": utc_now()}))
    atomic.write_text(path, "".join(ln + "\n" for ln in kept))  # whole or not at all
    return path.open("a")


def _metrics_step(line: str) -> float:
    """The step of one metrics line (0 for the header); a line cut by a kill is dropped (inf)."""
    try:
        return json.loads(line).get("step", 0)
    except (json.JSONDecodeError, AttributeError):
        return float("inf")
