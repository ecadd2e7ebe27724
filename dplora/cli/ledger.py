"""``dplora ledger``: caps, spend, plan checks, settling killed runs, intermediate releases.

Totals are stated by basic composition (Dwork & Roth 2014, Thm 3.16: sums of ε and of δ, exact) and by
composing the charges' stored events (dp_accounting PLD; Opacus RDP under add/remove) at the same total δ.
The logic lives in
:mod:`dplora.ledger.store`; this module only parses arguments and prints.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from dplora.cli.options import (
    LEDGER_DB_DEFAULT,
    SigningKeyOpt,
    data_key_option,
    json_option,
    ledger_option,
    show_private_option,
)
from dplora.errors import BadInputError, DploraError, one_line
from dplora.ledger.store import Ledger, default_ledger_path

ledger_app = typer.Typer(
    help="Privacy budget ledger: per-population (ε, δ) caps and charges, by basic composition and composed.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

DbOpt = Annotated[
    Path | None,
    ledger_option("Ledger file", default=LEDGER_DB_DEFAULT, names=("--db",)),
]
EpsOpt = Annotated[str, typer.Option("--epsilon", metavar="EPS", help="ε (unitless), e.g. 3.0")]
DeltaOpt = Annotated[str, typer.Option("--delta", metavar="DELTA", help="δ (probability), e.g. 1e-6")]
PopArg = Annotated[str, typer.Argument(metavar="POPULATION", help="Protected population, e.g. support-tickets-eu")]


@contextmanager
def _user_errors() -> Iterator[None]:
    """Print a DploraError as one ``error:`` line on stderr and exit with its code."""
    try:
        yield
    except DploraError as err:
        typer.echo(f"error: {one_line(str(err))}", err=True)
        raise typer.Exit(code=err.exit_code) from None


UnitOpt = Annotated[str, typer.Option("--unit", metavar="UNIT", help="Protected unit: row, ticket or user")]
AdjOpt = Annotated[str, typer.Option("--adjacency", metavar="ADJ", help="add_remove or replace_one")]
UnitKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--unit-key",
        metavar="KEY",
        help="The column that names the unit (the contracts' privacy.unit_key, e.g. customer_id): required for "
        "ticket and user, none for row. A run keyed by another column is refused.",
    ),
]


@ledger_app.command("set-cap", short_help="Set the (ε, δ) cap of a population, for one unit, key and adjacency.")
def set_cap(
    population: PopArg,
    epsilon: EpsOpt,
    delta: DeltaOpt,
    unit: UnitOpt,
    adjacency: AdjOpt,
    unit_key: UnitKeyOpt = None,
    db: DbOpt = None,
) -> None:
    """Set (or replace) the (ε, δ) cap of a population, pinned to one protected unit, unit key and adjacency."""
    with _user_errors(), Ledger(db or default_ledger_path()) as ledger:
        over = ledger.set_cap(
            population,
            epsilon_max=epsilon,
            delta_max=delta,
            protected_unit=unit,
            adjacency=adjacency,
            unit_key=unit_key,
        )
        keyed = f" (unit key {unit_key})" if unit_key else ""
        typer.echo(
            f"cap of population {population!r} set to ε_max={epsilon}, δ_max={delta} for protected unit {unit}"
            f"{keyed}, adjacency {adjacency} in {ledger.path}"
        )
        if over:  # the cap is set (charges are history); say what is already over it and by how much
            typer.echo(f"warning: {over}", err=True)


@ledger_app.command("check", short_help="Check a planned (ε, δ) against a population's cap.")
def check(population: PopArg, epsilon: EpsOpt, delta: DeltaOpt, db: DbOpt = None) -> None:
    """Exit 0 if a planned (ε, δ) fits the population's cap, else 2 with the reason."""
    with _user_errors(), Ledger(db or default_ledger_path(), create=False) as ledger:
        ledger.check(population, epsilon=epsilon, delta=delta)
        typer.echo(f"ok: population {population!r} has room for ε={epsilon}, δ={delta}")


RunIdArg = Annotated[str, typer.Argument(metavar="RUN_ID", help="The run id (see `dplora ledger show`).")]
CheckpointOpt = Annotated[
    Path | None,
    typer.Option("--checkpoint", metavar="PATH", help="The run's <output_dir>.partial, if it moved."),
]


AbandonOpt = Annotated[
    bool, typer.Option(help="Close a run that still has a resumable checkpoint (it can then not be resumed).")
]


@ledger_app.command("settle", short_help="Close the charge of a killed run that will not be resumed.")
def settle(
    run_id: RunIdArg,
    abandon: AbandonOpt = False,
    checkpoint: CheckpointOpt = None,
    db: DbOpt = None,
) -> None:
    """Close the pending charge of a killed run that will not be resumed, at its reserved ε (never the step it
    reached)."""
    from dplora.ledger.recovery import settle as settle_run

    with _user_errors(), Ledger(db or default_ledger_path(), create=False) as ledger:
        charge, how = settle_run(ledger, run_id, abandon=abandon, checkpoint=checkpoint)
        typer.echo(f"run {run_id} settled as failed at ε={charge.epsilon}, δ={charge.delta} ({how})")


ReleaseRunArg = Annotated[
    str, typer.Argument(metavar="RUN", help="A run id, or the run's <output_dir>.partial folder.")
]
DataKeyOpt = Annotated[Path | None, data_key_option()]
OutputOpt = Annotated[Path | None, typer.Option(metavar="DIR", help="Release folder. Default: <output_dir>.step-<k>.")]


@ledger_app.command("record-release", short_help="Sign an intermediate release from a checkpoint.")
def record_release(
    run: ReleaseRunArg,
    signing_key: SigningKeyOpt = None,
    data_key: DataKeyOpt = None,
    output: OutputOpt = None,
    checkpoint: CheckpointOpt = None,
    db: DbOpt = None,
) -> None:
    """Sign an intermediate release of a run stopped by the DP stop rule from its latest resume checkpoint (not a new
    charge); a run stopped by a signal or a failure is refused."""
    from dplora.ledger import recovery
    from dplora.release import envelope as release
    from dplora.release import keys as release_keys

    with _user_errors():
        private_key = release_keys.load_private_key(signing_key)
        key = release.load_data_key(data_key)
        with Ledger(db or default_ledger_path(), create=False) as ledger:
            folder, eps, steps = recovery.record_release(
                ledger,
                run,
                private_key=private_key,
                data_key=key,
                output=output,
                checkpoint=checkpoint,
                log=lambda message: typer.echo(message, err=True),
            )
        typer.echo(f"release: {folder / release.RELEASE_FILENAME} (intermediate, {steps} steps, ε={eps:.4f})")


def _age(created_at: str) -> str:
    """How long ago an ISO time was, e.g. ``2h05m`` (pending charges)."""
    from datetime import datetime, timezone

    seconds = max(0, int((datetime.now(timezone.utc) - datetime.fromisoformat(created_at)).total_seconds()))
    days, rest = divmod(seconds, 86400)
    return (f"{days}d" if days else "") + f"{rest // 3600}h{rest % 3600 // 60:02d}m"


PopulationArg = Annotated[str | None, typer.Argument(metavar="POPULATION", help="Only this population")]
ShowJsonOpt = Annotated[bool, json_option("JSON instead of tables")]
LedgerShowPrivateOpt = Annotated[
    bool,
    show_private_option(
        "Also show the charges' and releases' full times (settled_at, created_at): their differences are the "
        "private runs' durations, so a CI log gets dates only",
    ),
]


def public_times(entry: dict, keys: tuple[str, ...]) -> dict:
    """``entry`` with each time in ``keys`` cut to its UTC date (``YYYY-MM-DD``) and ``settled_at`` dropped.

    A charge is reserved before its run reads the data and settled, and its release written, after training: the
    times between them are the private run's wall time, a statistic of the private data that no accountant charges.
    The date alone is what a public view may show (docs/release.md, "The public surface").
    """
    out = {k: v for k, v in entry.items() if k != "settled_at"}
    for k in keys:
        if out.get(k):
            out[k] = str(out[k])[:10]
    return out


@ledger_app.command("show", short_help="Show caps, spend, charges and releases.")
def show(
    population: PopulationArg = None,
    db: DbOpt = None,
    as_json: ShowJsonOpt = False,
    show_private: LedgerShowPrivateOpt = False,
) -> None:
    """Show caps, spend, charges and releases (all populations, or one), and every unassigned run on its own.

    Times are dates only (a charge's settle time and a release's creation time minus the charge's reservation are a
    private run's duration); --show-private shows the full times.
    """
    with _user_errors(), Ledger(db or default_ledger_path(), create=False) as ledger:
        pops = [p for p in ledger.populations() if population is None or p["name"] == population]
        if population is not None and not pops:
            raise BadInputError(f"no population {population!r} in ledger {ledger.path}")
        charges = [c.to_dict() for c in ledger.charges(population)]
        for c in charges:
            c["age"] = _age(c["created_at"]) if c["status"] == "pending" else None
        releases = ledger.releases(population=population)
        unassigned = [] if population is not None else [c.to_dict() for c in ledger.unassigned()]
    for p in pops:
        p["attack_ceiling"] = _population_ceiling(p, charges)
    if not show_private:
        charges = [public_times(c, ("created_at",)) for c in charges]
        unassigned = [public_times(c, ("created_at",)) for c in unassigned]
        releases = [public_times(r, ("created_at",)) for r in releases]
    if as_json:
        doc = {"populations": pops, "charges": charges, "unassigned": unassigned, "releases": releases}
        typer.echo(json.dumps(doc, indent=2))
        return
    for line in _show_lines(pops, charges, releases, unassigned):
        typer.echo(line)


def _population_ceiling(pop: dict, charges: list[dict]) -> dict:
    """The attack ceiling of a population's charges composed
    (:func:`dplora.accounting.ceiling_compose.composed_ceiling`), stated only when every charge stores its mechanism
    and all name the same known unit key (as the composed ε)."""
    from dplora.accounting.ceiling_compose import composed_ceiling

    mine = [c for c in charges if c["population"] == pop["name"]]
    keys, relations = {c.get("unit_key") for c in mine}, {c.get("adjacency") for c in mine}
    if not mine or any(c.get("events") is None for c in mine) or None in keys or len(keys) != 1 or len(relations) != 1:
        return {"available": False, "reason": "a charge's mechanism or unit key is unknown (or no charges)"}
    return composed_ceiling([e for c in mine for e in c["events"]], relations.pop())


def _ceiling_lines(entry: dict | None) -> list[str]:
    """The population's composed attack ceiling in two lines under 80 columns (TPRs rounded UP), or why not."""
    if not entry or not entry.get("available"):
        import textwrap

        reason = str((entry or {}).get("reason", "not computed"))
        return ["    attack ceiling: not stated:"] + textwrap.wrap(
            reason, 80, initial_indent=" " * 6, subsequent_indent=" " * 6
        )
    from dplora.accounting.ceiling import percent_up

    at = entry["true_positive_rate_at"]
    return [
        "    attack ceiling (all charges), TPR at FPR:",
        "      " + ", ".join(f"{percent_up(v, 2)} % at {k.replace('%', ' %')}" for k, v in at.items()),
    ]


def _key(key: str | None) -> str:
    """A charge's stored unit key as ``show`` prints it."""
    return "key unknown" if key is None else (key or "none (row level)")


def _tighter(p: dict) -> tuple[str, str | None]:
    """(ε spent, ε left) of one population as the cap check counts it: the smaller of the exact basic total and the
    composed ε (4 decimals), and the cap minus it (None without a cap)."""
    from decimal import Decimal

    basic, composed = Decimal(p["epsilon_spent"]), p["epsilon_composed"]
    spent = basic if composed is None or basic <= Decimal(repr(composed)) else Decimal(format(composed, ".4f"))
    if p["epsilon_max"] is None:
        return str(spent), None
    return str(spent), str(Decimal(p["epsilon_max"]) - spent)


def _show_lines(pops: list[dict], charges: list[dict], releases: list[dict], unassigned=()) -> list[str]:
    """Plain lines under 80 columns: full run ids, record digests and exact decimal numbers, never cut.

    Unassigned runs (no ``privacy.population``) are listed one by one, never summed: each holds for its own data.
    """
    lines = ["populations (ε at δ = Σδ: the tighter of basic and composed totals)"]
    for p in pops:
        flag = "  OVER CAP" if p["over_cap"] else ""
        composed = p["epsilon_composed"]
        spent, left = _tighter(p)
        lines += [
            f"  {p['name']}{flag}",
            f"    protected unit {p['protected_unit']}, unit key {p['unit_key']}, adjacency {p['adjacency']}",
            f"    ε spent {spent} of cap {p['epsilon_max']}, left {left} (the tighter total)",
            f"      basic {p['epsilon_spent']}; composed "
            + ("n/a" if composed is None else format(composed, ".4f"))
            + f" ({p['composed_by'] or 'no events to compose'})",
            f"    δ spent {p['delta_spent']} of cap {p['delta_max']}, left {p['delta_left']}",
            *_ceiling_lines(p.get("attack_ceiling")),
        ]
    lines.append("charges")
    for c in charges:
        lines += [
            f"  run {c['run_id']}  {c['purpose']}, {c['status']}",
            f"    population {c['population']}, accountant {c['accountant']}",
            f"    ε {c['epsilon']} (reserved {c['reserved_epsilon']}), δ {c['delta']}",
        ]
        if c["status"] == "pending":
            lines += [
                f"    pending for {c['age']}: resume it with `dplora train CONFIG --resume`,",
                f"    or close it with `dplora ledger settle {c['run_id']}`",
            ]
    lines.append("unassigned runs (no population: each stands alone, never composed or summed)")
    for u in unassigned:
        lines += [
            f"  run {u['run_id']}  {u['purpose']}, {u['status']}",
            f"    output {u['output_dir']}",
            f"    protected unit {u['protected_unit']}, unit key {_key(u['unit_key'])}, adjacency {u['adjacency']}",
            f"    accountant {u['accountant']}",
            f"    ε {u['epsilon']} at δ {u['delta']} (reserved ε {u['reserved_epsilon']})",
        ]
    lines.append("releases (post-processing of a charged run: not new charges)")
    for r in releases:
        lines += [
            f"  run {r['run_id']}  {r['label']}",
            f"    ε {r['epsilon']}, δ {r['delta']}, created {r['created_at']}",
            "    record sha256:",
            f"      {r['record_sha256']}",
        ]
    return lines
