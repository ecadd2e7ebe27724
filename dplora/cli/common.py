"""What every ``dplora`` command shares: the two consoles, one-line errors with their exit codes, JSON output."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping

import typer
from rich.console import Console

from dplora.errors import DploraError, one_line

console = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)  # one line per message
out = Console(highlight=False, markup=False, soft_wrap=True)  # stdout: never hard-wrapped

# torchrun's agent stops every other process (SIGTERM) as soon as one exits. A quiet process that exits first on bad
# input could so stop the node's first process before it prints the one line that says why: the quiet one lingers
# this long first (the first process meets the same input at about the same time and exits 2, which ends the wait).
QUIET_EXIT_GRACE_S = 5.0


def quiet_worker(env: Mapping[str, str] = os.environ) -> bool:
    """True in a process that a launcher (torchrun, accelerate launch) started other than the first on its node.

    Bad input is the same on every rank (each reads the same contract, overrides and files), so W processes would
    print W copies of one line; the first process on each node prints it and the others exit 2 silently. A refusal
    that only another rank meets still reaches the first one: the admission gate makes rank 0 raise it naming that
    rank (:func:`dplora.engine.distributed.gate`). Each node's first process speaks, not only rank 0, so that a
    node whose own copy of an input is bad (read before the process group forms) still says why.
    """
    try:
        if int(env.get("WORLD_SIZE", "1") or 1) <= 1:
            return False
        return int(env.get("LOCAL_RANK", env.get("RANK", "0")) or 0) != 0
    except ValueError:  # a launcher's variable we cannot read: speak rather than hide an error
        return False


def linger_before_quiet_exit() -> None:
    """In a quiet process under torchrun's agent (``$TORCHELASTIC_RUN_ID``, also set by accelerate's multi-process
    launch), wait :data:`QUIET_EXIT_GRACE_S` seconds before exiting on bad input; elsewhere return at once."""
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        time.sleep(QUIET_EXIT_GRACE_S)


def fail(err: DploraError, *, as_json: bool = False) -> typer.Exit:
    """Print the error as one bounded line on stderr (and, with ``--json``, as a JSON document on stdout).

    Bad input (exit 2) prints nothing in a launcher's other processes (:func:`quiet_worker`): one line per node;
    under torchrun such a process waits :data:`QUIET_EXIT_GRACE_S` before it exits, so that the launcher does not
    stop the node's first process before its line is out.
    """
    if err.exit_code == 2 and quiet_worker():
        linger_before_quiet_exit()
        return typer.Exit(code=err.exit_code)
    message = one_line(str(err), limit=err.max_chars)
    console.print(f"error: {message}", markup=False, soft_wrap=True)
    if as_json:
        emit_json(error_doc(err.exit_code, message))
    return typer.Exit(code=err.exit_code)


def error_doc(code: int, message: str) -> dict:
    """The ``--json`` document of a failed command."""
    return {"ok": False, "exit_code": code, "error": message}


def _finite(obj):
    """JSON-safe copy: non-finite floats become null (JSON has no NaN or Infinity)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def emit_json(doc: dict) -> None:
    """Exactly one JSON document on stdout (ASCII, so any locale can read it)."""
    typer.echo(json.dumps(_finite(doc), indent=2, ensure_ascii=True, allow_nan=False))


def log(message: str) -> None:
    """One bounded line on stderr."""
    console.print(one_line(message, limit=2000), markup=False, soft_wrap=True)
