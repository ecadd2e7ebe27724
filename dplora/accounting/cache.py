"""dplora's on-disk cache of accounting results (``calibration.json`` in the user cache folder).

An optimisation only: every entry is validated when read, a damaged file is ignored and rewritten, and an
unwritable folder is not an error. Keys carry everything the value depends on (library versions, tolerance,
rule version). The final ε of a plan is never read from it.
"""

from __future__ import annotations

import json
import os
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


def load() -> dict:
    """All entries (an empty dict when the file is missing or damaged)."""
    try:
        data = json.loads(_cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def put(key: str, value) -> None:
    """Store ``value`` (JSON-ready) under ``key``, atomically; failures are ignored."""
    try:
        data = load()
        data[key] = value
        path = _cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(path, data, indent=None, sort_keys=False)  # whole or not at all
    except (OSError, ValueError, atomic.DiskFullError):
        pass  # a cache is an optimisation only
