"""dplora's on-disk cache of accounting results (``calibration.json`` in the user cache folder).

An optimisation only: every entry is validated when read, a damaged file is ignored and rewritten, and an
unwritable folder is not an error. Keys carry everything the value depends on (library versions, tolerance,
rule version).

Nothing dplora states is read from it, because the file is writable by whoever shares the folder (a CI cache, a
shared home): it holds calibrated σ's (the plan's every ε, final included, is then computed from σ), the attack
ceiling's PLD interval choice (a hint: any interval keeps the pessimistic PLD an upper bound) and the TPRs of the
planner's candidate table (a table to choose by). The ε curve and every stated ceiling are computed each time.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from dplora import atomic

CACHE_ENV = "DPLORA_CACHE_DIR"
RULE_VERSION = "checked-v2"  # bump when the rule that turns accountant answers into ε changes


def cache_dir() -> Path:
    """User cache folder of dplora: ``$DPLORA_CACHE_DIR``, else ``$XDG_CACHE_HOME/dplora``, else ``~/.cache/dplora``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dplora"


def _cache_file() -> Path:
    return cache_dir() / "calibration.json"


MAX_BYTES = 64 * 2**20  # far above any real cache; a larger file is ignored, not read into memory


def load() -> dict:
    """All entries (an empty dict when the file is missing, damaged, or not a regular file of at most 64 MiB).

    Opened non-blocking and checked to be a regular file before it is read, so a FIFO or a device put in its place
    cannot hang a command; JSON nested too deep for the parser is damage like any other."""
    try:
        fd = os.open(_cache_file(), os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_BYTES:
            return {}
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = json.loads(handle.read(MAX_BYTES + 1).decode("utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError, MemoryError):
        return {}
    finally:
        os.close(fd)


def put(key: str, value) -> None:
    """Store ``value`` (JSON-ready) under ``key``, atomically; failures are ignored."""
    try:
        data = load()
        data[key] = value
        path = _cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(path, data, indent=None, sort_keys=False)  # whole or not at all
    except (OSError, ValueError, RecursionError, MemoryError, atomic.DiskFullError):
        pass  # a cache is an optimisation only
