"""What the worker scripts tests/dist_train_worker.py and tests/fsdp_seams_worker.py share (each imports it after
its own set-up; run as a script, a worker finds this file beside it on sys.path)."""

from __future__ import annotations

import json
from pathlib import Path


def run_app_and_record(app, args: list[str], out: Path, rank: int) -> None:
    """Run ``dplora ARGS`` (the CLI ``app``) and write its exit code to ``OUT/rank<rank>.json``."""
    try:
        app(args)
        code = 0
    except SystemExit as exc:
        code = exc.code
    (out / f"rank{rank}.json").write_text(json.dumps({"exit_code": code}))
