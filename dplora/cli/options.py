"""Arguments and options shared by several ``dplora`` commands, each declared once (Typer ``Annotated`` aliases)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
