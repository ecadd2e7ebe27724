"""``dplora ledger``: set per-population privacy caps, show spend, and check a plan against a cap.

Totals use basic composition (Dwork & Roth 2014, Thm 3.16): sums of ε (unitless) and of δ
(probability) over every charge on a population, computed exactly. The logic lives in
:mod:`dplora.ledger`; this module only parses arguments and prints.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dplora.errors import BadInputError, DploraError
from dplora.ledger import Ledger, default_ledger_path

ledger_app = typer.Typer(
    help="Privacy budget ledger: per-population (ε, δ) caps and charges, summed by basic composition.",
    no_args_is_help=True,
)

DbOpt = Annotated[
    Path | None,
    typer.Option(
        "--db", "--ledger", help="Ledger file [default: $DPLORA_LEDGER, else $XDG_DATA_HOME/dplora/ledger.sqlite3]"
    ),
]
EpsOpt = Annotated[str, typer.Option("--epsilon", help="ε (unitless), e.g. 3.0")]
DeltaOpt = Annotated[str, typer.Option("--delta", help="δ (probability), e.g. 1e-6")]
PopArg = Annotated[str, typer.Argument(help="Protected population, e.g. support-tickets-eu")]


@contextmanager
def _user_errors() -> Iterator[None]:
    """Print a DploraError as one ``error:`` line on stderr and exit with its code."""
    try:
        yield
    except DploraError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=err.exit_code) from None


@ledger_app.command("set-cap")
def set_cap(population: PopArg, epsilon: EpsOpt, delta: DeltaOpt, db: DbOpt = None) -> None:
    """Set (or replace) the (ε, δ) cap of a population."""
    with _user_errors(), Ledger(db or default_ledger_path()) as ledger:
        ledger.set_cap(population, epsilon_max=epsilon, delta_max=delta)
        typer.echo(f"cap of population {population!r} set to ε_max={epsilon}, δ_max={delta} in {ledger.path}")


@ledger_app.command("check")
def check(population: PopArg, epsilon: EpsOpt, delta: DeltaOpt, db: DbOpt = None) -> None:
    """Exit 0 if a planned (ε, δ) fits the population's cap, else 2 with the reason."""
    with _user_errors(), Ledger(db or default_ledger_path(), create=False) as ledger:
        ledger.check(population, epsilon=epsilon, delta=delta)
        typer.echo(f"ok: population {population!r} has room for ε={epsilon}, δ={delta}")


@ledger_app.command("show")
def show(
    population: Annotated[str | None, typer.Argument(help="Only this population")] = None,
    db: DbOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables")] = False,
) -> None:
    """Show caps, spend, charges and releases (all populations, or one)."""
    with _user_errors(), Ledger(db or default_ledger_path(), create=False) as ledger:
        pops = [p for p in ledger.populations() if population is None or p["name"] == population]
        if population is not None and not pops:
            raise BadInputError(f"no population {population!r} in ledger {ledger.path}")
        charges = [c.to_dict() for c in ledger.charges(population)]
        releases = ledger.releases(population=population)
    if as_json:
        typer.echo(json.dumps({"populations": pops, "charges": charges, "releases": releases}, indent=2))
        return
    console = Console()
    table = Table(title="populations (basic composition: sums of ε and δ)")
    for col in ("population", "ε spent / cap", "ε left", "δ spent / cap", "δ left", ""):
        table.add_column(col, no_wrap=col == "population")
    for p in pops:
        flag = "[bold red]OVER CAP[/]" if p["over_cap"] else ""
        table.add_row(
            p["name"],
            f"{p['epsilon_spent']} / {p['epsilon_max']}",
            str(p["epsilon_left"]),
            f"{p['delta_spent']} / {p['delta_max']}",
            str(p["delta_left"]),
            flag,
        )
    console.print(table)
    table = Table(title="charges")
    cols = ("run_id", "population", "purpose", "status", "epsilon", "reserved_epsilon", "delta", "accountant")
    for col in cols:
        table.add_column(col.replace("epsilon", "ε").replace("delta", "δ").replace("_", " "), overflow="fold")
    for c in charges:
        table.add_row(*(str(c[k]) for k in cols))
    console.print(table)
    table = Table(title="releases (post-processing of a charged run: not new charges)")
    for col in ("run_id", "record sha256", "ε", "δ", "label", "created_at"):
        table.add_column(col)
    for r in releases:
        table.add_row(r["run_id"], r["record_sha256"][:16], r["epsilon"], r["delta"], r["label"], r["created_at"])
    console.print(table)
