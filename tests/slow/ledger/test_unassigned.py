"""A ledger that always records (issue 26.6): a DP run without ``privacy.population`` is an unassigned run, listed
one by one and never composed; a non-private control without a population is not charged; ``set-cap`` below what
is spent says what is over and by how much; a schema-2 ledger written by the previous dplora is migrated."""

from __future__ import annotations

import json
import shutil
import sqlite3
from decimal import Decimal
from pathlib import Path

import pytest
from conftest import train_tiny
from typer.testing import CliRunner

from dplora.cli.ledger import ledger_app
from dplora.errors import BadInputError
from dplora.ledger.store import Ledger

SGD = {"mechanism": "dp_sgd", "sample_rate": 0.01, "noise_multiplier": 1.0, "steps": 300}
MAIN_SCHEMA_2 = (
    Path(__file__).resolve().parents[2] / "ledger" / "data" / "schema2_main.sqlite3"
)  # made by dplora before issue 26


def _cli(*args: str):
    import typer

    app = typer.Typer()
    app.add_typer(ledger_app, name="ledger")

    @app.command()
    def _noop() -> None:
        pass

    return CliRunner().invoke(app, ["ledger", *args])


def _unassigned(ledger: Ledger, run_id: str, eps: str, *, unit="row", adjacency="add_remove", out="/o/run"):
    ev = {**SGD, "adjacency": adjacency, "accountant": "rdp"}
    return ledger.reserve(
        population=None,
        run_id=run_id,
        output_dir=out,
        epsilon=eps,
        delta="1e-5",
        accountant="rdp",
        adjacency=adjacency,
        protected_unit=unit,
        unit_key=None if unit == "row" else "user_id",
        events=[ev],
    )


def test_a_dp_run_without_population_is_recorded_and_shown(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """`dplora train` without privacy.population: the run is in the ledger (created at --ledger), settled at its ε,
    with its output folder, unit and adjacency; `ledger show` lists it; no population counts it."""
    db = tmp_path / "ledger.sqlite3"
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, "--ledger", str(db))
    assert result.exit_code == 0, result.output
    (charge,) = Ledger(db).unassigned()
    record = json.loads((out / "release.dsse.json").read_text())
    assert charge.status == "settled" and charge.population is None and charge.unassigned
    assert charge.output_dir == str(out.resolve()) and charge.protected_unit == "row"
    assert charge.adjacency == "add_remove" and charge.events[0]["mechanism"] == "dp_sgd"
    assert float(charge.epsilon) > 0 and record  # ε of the finished run
    assert Ledger(db).populations() == [] and Ledger(db).charges() == []  # never under a population
    assert [r["label"] for r in Ledger(db).releases(charge.run_id)] == ["final"]
    shown = _cli("show", "--db", str(db))
    assert shown.exit_code == 0, shown.output
    assert f"run {charge.run_id}" in shown.output and str(out.resolve()) in shown.output
    assert "protected unit row, unit key none (row level), adjacency add_remove" in shown.output
    assert f"ε {charge.epsilon} at δ {charge.delta}" in shown.output
    doc = json.loads(_cli("show", "--db", str(db), "--json").output)
    assert [u["run_id"] for u in doc["unassigned"]] == [charge.run_id]


def test_a_non_private_control_without_population_is_not_charged(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    db = tmp_path / "ledger.sqlite3"
    result, _ = train_tiny(
        tmp_path, tiny_model_dir, tickets_csv, signing_key, "--ledger", str(db), privacy={"enabled": False}
    )
    assert result.exit_code == 0, result.output
    assert not db.exists()  # as before: a control without a population touches no ledger


def test_unassigned_runs_are_listed_one_by_one_and_never_composed(tmp_path):
    """Two unassigned runs of other units stay two lines, and a population's total ignores them."""
    db = tmp_path / "l.sqlite3"
    with Ledger(db) as ledger:
        ledger.set_cap("p", epsilon_max="3", delta_max="1e-4", protected_unit="row", adjacency="add_remove")
        _unassigned(ledger, "u1", "2.5", out="/o/a")
        _unassigned(ledger, "u2", "2.5", unit="user", adjacency="replace_one", out="/o/b")
        ledger.check("p", epsilon="2.9", delta="1e-5")  # 5.0 unassigned ε elsewhere does not count against p
        assert ledger.spent("p") == (Decimal(0), Decimal(0))
        assert [(c.run_id, c.protected_unit, c.adjacency) for c in ledger.unassigned()] == [
            ("u1", "row", "add_remove"),
            ("u2", "user", "replace_one"),
        ]
        assert [p["name"] for p in ledger.populations()] == ["p"]
        ledger.settle("u1", epsilon_spent="2.0")
        assert ledger.charge("u1").status == "settled" and ledger.charge("u1").epsilon == Decimal("2.0")
    out = _cli("show", "--db", str(db)).output
    assert out.count("  run u") == 2 and "5.0" not in out and "4.5" not in out  # each on its own, never a sum
    assert "ε 2.0 at δ 0.00001" in out and "ε 2.5 at δ 0.00001" in out
    with pytest.raises(Exception, match="already has a charge"):
        _unassigned(Ledger(db), "u1", "1")


def test_set_cap_below_spent_sets_it_and_says_by_how_much(tmp_path):
    db = tmp_path / "l.sqlite3"
    with Ledger(db) as ledger:
        ledger.set_cap("p", epsilon_max="5", delta_max="1e-4", protected_unit="row", adjacency="add_remove")
        for run, eps in (("a", "1.5"), ("b", "1.25")):
            ledger.reserve(
                population="p", run_id=run, epsilon=eps, delta="1e-5", accountant="rdp", adjacency="add_remove",
                protected_unit="row",
            )  # fmt: skip
    res = _cli(
        "set-cap", "p", "--epsilon", "2", "--delta", "1.5e-5", "--unit", "row", "--adjacency", "add_remove", "--db",
        str(db),
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "warning: population 'p' is over its new cap" in res.stderr
    assert "ε spent 2.75 (basic)" in res.stderr and "over ε_max=2 by 0.75" in res.stderr
    assert "δ spent 0.00002 is over δ_max=0.000015 by 0.000005" in res.stderr
    assert Ledger(db).cap("p") == (Decimal("2"), Decimal("0.000015"))  # still set
    ok = _cli("set-cap", "p", "--epsilon", "9", "--delta", "1e-4", "--unit", "row", "--adjacency", "add_remove",
              "--db", str(db))  # fmt: skip
    assert ok.exit_code == 0 and "warning" not in ok.stderr


def test_a_schema_2_ledger_from_the_previous_dplora_is_migrated(tmp_path):
    """The file was written by dplora's main branch before issue 26 (schema 2): it opens as schema 4 (through 3)
    with every charge, release, cap and total unchanged, and takes unassigned runs afterwards."""
    db = tmp_path / "old.sqlite3"
    shutil.copy(MAIN_SCHEMA_2, db)
    assert sqlite3.connect(db).execute("SELECT version FROM schema_version").fetchone()[0] == 2
    with Ledger(db) as ledger:
        assert sqlite3.connect(db).execute("SELECT version FROM schema_version").fetchone()[0] == 4  # 2 → 3 → 4
        assert [(c.run_id, c.status, str(c.epsilon)) for c in ledger.charges()] == [
            ("main-r1", "settled", "1.4"),
            ("main-r2", "pending", "1.0"),
        ]
        assert ledger.spent("tickets") == (Decimal("2.4"), Decimal("0.00002"))
        assert ledger.cap("tickets") == (Decimal("5"), Decimal("0.0001"))
        assert ledger.pinned("tickets") == ("row", "add_remove")
        assert ledger.total("tickets")["epsilon"] == pytest.approx(1.359020335856053, rel=1e-6)
        assert [r["label"] for r in ledger.releases()] == ["final"] and ledger.unassigned() == []
        _unassigned(ledger, "new", "1.0")
        assert [c.run_id for c in ledger.unassigned()] == ["new"] and ledger.spent("tickets")[0] == Decimal("2.4")


def test_an_unassigned_run_may_have_any_output_path_the_contract_accepts(tmp_path):
    """The output folder is a path, not a name: 300 characters and a trailing space are stored as given (the
    contract allows 4,096); a path with a line break is refused before anything is stored."""
    ledger = Ledger(tmp_path / "l.sqlite3")
    long_path = "/" + "x" * 299
    _unassigned(ledger, "r1", "1", out=long_path)
    _unassigned(ledger, "r2", "1", out="/o/ends with a space ")
    assert sorted(c.output_dir for c in ledger.unassigned()) == sorted([long_path, "/o/ends with a space "])
    with pytest.raises(BadInputError, match="one-line path"):
        _unassigned(ledger, "r3", "1", out="/o/two\nlines")
    assert len(ledger.unassigned()) == 2


def test_one_reserve_takes_an_output_folder_only_without_a_population(tmp_path):
    """``reserve(population=None)`` is the unassigned run: its folder is required there and refused elsewhere."""
    fields = {
        "run_id": "u9", "epsilon": "1.5", "delta": "1e-5", "accountant": "rdp", "adjacency": "add_remove",
        "protected_unit": "row",
    }  # fmt: skip
    with Ledger(tmp_path / "l.sqlite3") as ledger:
        ledger.set_cap("p", epsilon_max="5", delta_max="1e-4", protected_unit="row", adjacency="add_remove")
        with pytest.raises(BadInputError, match="^an unassigned run \\(no population\\) needs its output_dir$"):
            ledger.reserve(population=None, **fields)
        with pytest.raises(BadInputError, match="^output_dir is recorded for an unassigned run only"):
            ledger.reserve(population="p", output_dir="/o/run", **fields)
        assert ledger.charges() == [] and ledger.unassigned() == []  # neither refusal wrote anything
        charge = ledger.reserve(population=None, output_dir="/o/run", **fields)
        assert (charge.population, charge.output_dir, charge.epsilon) == (None, "/o/run", Decimal("1.5"))
        assert ledger.unassigned() == [charge] and ledger.spent("p") == (Decimal(0), Decimal(0))
