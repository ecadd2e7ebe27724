"""Arguments and options shared by several ``dplora`` commands, each declared once (Typer ``Annotated`` aliases)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    import click

ConfigArg = Annotated[Path, typer.Argument(metavar="CONFIG", help="The YAML privacy contract.", show_default=False)]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="KEY=VALUE",
        help="Overrides with dotted keys, e.g. training.lr=1e-3 privacy.target_epsilon=8.",
        show_default=False,
    ),
]
LedgerOpt = Annotated[
    Path | None,
    typer.Option(
        "--ledger", metavar="PATH", help="Budget ledger (SQLite). Default: $DPLORA_LEDGER or the user data dir."
    ),
]
RunArg = Annotated[
    Path, typer.Argument(metavar="RUN_OR_CONFIG", help="A finished run folder, or the contract that wrote it.")
]
ThreadsOpt = Annotated[
    int | None, typer.Option(min=1, metavar="N", help="CPU threads. Default: the cores free right now.")
]
JsonLinesOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of lines.")]
JsonLineOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of a line.")]
TopPOpt = Annotated[float, typer.Option(help="Nucleus mass kept when sampling, in (0, 1].")]
SeedOpt = Annotated[int | None, typer.Option(metavar="N", help="Seed for sampling. Default: OS entropy.")]
ReplaceFileOpt = Annotated[bool, typer.Option(help="Replace an existing file.")]
PemSigningKeyOpt = Annotated[
    Path | None, typer.Option(metavar="PATH", help="Ed25519 private key (PEM). Default: $DPLORA_SIGNING_KEY.")
]
TuningThreadsOpt = Annotated[int | None, typer.Option(min=1, max=1024, metavar="N", help="CPU threads.")]
TrainingProgressOpt = Annotated[bool, typer.Option(help="Report training progress on stderr.")]


def _expand(value):
    """A path (or a list/tuple of paths) with a leading ``~``/``~user`` expanded; anything else unchanged."""
    if isinstance(value, Path):
        return Path(os.path.expanduser(value))
    if isinstance(value, list | tuple):
        return type(value)(_expand(v) for v in value)
    return value


def expand_user_paths(command: click.Command) -> None:
    """Expand a leading ``~`` in every path argument and option of ``command`` and its subcommands (in place).

    Done once, on the whole command tree (each parameter's click ``callback`` is wrapped, after typer made the
    value a ``Path``), so every path any command declares expands ``~`` as a shell would; ``--key=~/k.pem`` and
    quoted paths reach the program unexpanded otherwise. Text values (``--prompt``) are not paths: unchanged.
    """
    for param in command.params:
        if getattr(param, "_dplora_expands_user", False):
            continue
        inner = param.callback

        def callback(ctx, par, value, inner=inner):
            value = _expand(value)
            return inner(ctx, par, value) if inner is not None else value

        param.callback, param._dplora_expands_user = callback, True
    for sub in getattr(command, "commands", {}).values():
        expand_user_paths(sub)
