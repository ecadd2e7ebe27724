"""What every ``dplora`` command shares: the two consoles, one-line errors with their exit codes, JSON output."""

from __future__ import annotations

import json

import typer
from rich.console import Console

from dplora.errors import DploraError, one_line

console = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)  # one line per message
out = Console(highlight=False, markup=False, soft_wrap=True)  # stdout: never hard-wrapped


def fail(err: DploraError, *, as_json: bool = False) -> typer.Exit:
    """Print the error as one bounded line on stderr (and, with ``--json``, as a JSON document on stdout)."""
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
