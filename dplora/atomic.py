"""Whole files or nothing: every file dplora writes goes to a temporary name in the same folder, is fsynced, then
renamed over its target (``os.replace``), and the folder is fsynced. Readers see the old bytes or the new ones,
never a 0-byte or half-written file; on any error the temporary file is removed. A full disk (ENOSPC, EDQUOT)
raises :class:`DiskFullError`, whose one line names the target file and its folder (never a byte count).

Appends (``metrics.jsonl``) write one whole line per call; if the write fails the file is cut back to its length
before the call, so a partial last line cannot remain (readers also drop a last line without its ``\\n``).

Source: the POSIX rename-over pattern (``rename(2)``: atomic within one file system) with ``fsync(2)`` of the file
and of its directory, as in SQLite's and Git's lock-file writers.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dplora.errors import DploraError

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class DiskFullError(DploraError):
    """No space left (ENOSPC) or quota exceeded (EDQUOT) while writing a named file (exit code 4).

    An environment fault, not bad input: the target file is left as it was (old bytes or absent).
    """

    exit_code = 4


def disk_full_error(target: Path, err: OSError) -> DiskFullError:
    """The one-line :class:`DiskFullError` for ``target``: the file and its folder, never a byte count.

    No size is printed: the line reaches the job log and ``FAILED.json``, and the size of a run's private files (its
    metrics, a checkpoint's header) grows with the steps it took and carries their private numbers. Neither is the
    folder's free space, which the same writes move.
    """
    what = "quota exceeded" if err.errno == errno.EDQUOT else "disk full"
    return DiskFullError(f"{what} writing {target} (the file was left as it was): free space in {Path(target).parent}")


def fsync_dir(folder: Path) -> None:
    """fsync a directory so a rename in it survives a crash (best effort where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_folder(target: Path, write: Callable[[Path], object]) -> Path:
    """Write a whole folder (a library's ``save_pretrained``) atomically: into a temp sibling, fsync, rename.

    Args:
        target: the folder to create or replace (e.g. ``<output_dir>.partial/adapter``).
        write: called with the temp folder; writes every file into it (its own plain ``open`` calls are fine).
    Returns:
        ``target``; it holds the old folder or the complete new one, never part of one.
    Raises:
        DiskFullError: no space (ENOSPC/EDQUOT) while writing; the temp folder is removed, ``target`` unchanged.
    """
    target = Path(target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        for path in sorted(tmp.rglob("*")):
            if path.is_file():
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise disk_full_error(target, err) from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


@contextmanager
def replacing(path: Path, *, text: bool = False, mode: int = 0o644, newline: str | None = None) -> Iterator:
    """A file object on a temp name beside ``path``; on a clean exit it is fsynced and renamed over ``path``.

    For writers that stream (CSV, JSONL): ``with replacing(p, text=True) as fh: fh.write(...)``.

    Args:
        path: The target file; its folder must exist.
        text: Text mode (UTF-8) if True, else binary.
        mode: Permission bits of the new file (0644 unless given, e.g. 0600 for a private key).
        newline: As :func:`open`'s, in text mode.
    Raises:
        DiskFullError: ENOSPC or EDQUOT (the message names ``path`` and its folder); the temp file is removed and
            ``path`` keeps its old content (or stays absent).
        OSError: Any other write error (the temp file is removed first).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        kw = {"encoding": "utf-8", "newline": newline} if text else {}
        with os.fdopen(fd, "w" if text else "wb", **kw) as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
            raise disk_full_error(path, err) from err
        raise
    fsync_dir(path.parent)


def write_temp(folder: Path, name: str, data: bytes) -> Path:
    """Write ``data`` to a new fsynced temp file ``folder/.name.*.tmp`` (mode 0644) and return its path, for a
    caller that renames several files in an order of its own (a signed release: envelope, then bundle).

    Raises:
        DiskFullError: ENOSPC or EDQUOT, naming ``folder/name`` (the temp file is removed first).
        OSError: Any other write error (the temp file is removed first).
    """
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o644)
            os.fsync(f.fileno())
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
            raise disk_full_error(Path(folder) / name, err) from err
        raise
    return Path(tmp)


def write_bytes(path: Path, data: bytes, *, mode: int = 0o644) -> Path:
    """Write ``data`` (bytes) to ``path`` atomically: temp file in the same folder, fsync, rename, fsync folder.

    Args:
        path: The target file; its folder must exist.
        data: The whole content.
        mode: Permission bits of the new file (0644 unless given, e.g. 0600 for a private key).
    Returns:
        ``path``.
    Raises:
        DiskFullError: ENOSPC or EDQUOT (the message names ``path`` and the bytes needed vs free); the temp file is
            removed and ``path`` keeps its old content (or stays absent).
        OSError: Any other write error (the temp file is removed first).
    """
    try:
        with replacing(path, mode=mode) as f:
            f.write(data)
    except DiskFullError as err:
        raise disk_full_error(Path(path), err.__cause__) from err.__cause__
    return Path(path)


def write_text(path: Path, text: str, *, mode: int = 0o644) -> Path:
    """:func:`write_bytes` of ``text`` encoded as UTF-8. Raises: as :func:`write_bytes`."""
    return write_bytes(path, text.encode("utf-8"), mode=mode)


def write_json(path: Path, obj, *, indent: int | None = 2, sort_keys: bool = True) -> Path:
    """:func:`write_text` of ``obj`` as JSON, one trailing newline; ±inf is written as ``Infinity`` (as
    ``json.dumps`` does: a control's ε). Raises: as :func:`write_bytes`, and TypeError for an object JSON cannot
    hold (before anything is written)."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n"
    return write_text(path, text)


def append_line(handle, line: str, *, sync: bool = True) -> None:
    """Append one whole line (``line`` without its ``\\n``) to an open binary-or-text file, then flush and fsync.

    A failed write cuts the file back to its length before the call, so no partial line is left.

    Raises:
        DiskFullError: ENOSPC or EDQUOT (naming the file); the file is as it was before the call.
        OSError: Any other write error (the file is cut back too, where possible).
    """
    text = line.rstrip("\n") + "\n"
    handle.flush()
    try:
        fd = handle.fileno()
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except (AttributeError, OSError, ValueError):  # an in-memory stream (tests): nothing to cut back or sync
        handle.write(text)
        return
    if not regular:  # os.devnull, a pipe: no length to cut back to, nothing to sync
        os.write(fd, text.encode("utf-8"))
        return
    data = text.encode("utf-8")
    start = os.lseek(fd, 0, os.SEEK_END)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if sync:
            os.fsync(fd)
    except OSError as err:
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass
        if err.errno in DISK_FULL_ERRNOS:
            raise disk_full_error(Path(handle.name), err) from err
        raise


def complete_lines(text: str) -> list[str]:
    """The lines of ``text`` that end with ``\\n`` (a last line cut by a kill or a full disk is dropped)."""
    lines = text.split("\n")
    return lines[:-1]
