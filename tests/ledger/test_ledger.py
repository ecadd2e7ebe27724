"""Tests of the privacy budget ledger (dplora.ledger.store) and its CLI (dplora.cli.ledger)."""

from __future__ import annotations

import json
import os
import sqlite3
from decimal import Decimal
from pathlib import Path

import pytest
import typer
from conftest import set_cap_args
from support.ledger import POP, SHA, capped_ledger, ledger_db, shared_reserve
from typer.testing import CliRunner

from dplora.cli.ledger import ledger_app
from dplora.errors import BadInputError, PlanRefusedError
from dplora.ledger.store import LEDGER_ENV, Ledger, LedgerError, default_ledger_path

db = ledger_db  # the two fixtures both tiers use
ledger = capped_ledger


def test_reserve_over_cap_is_refused_and_writes_nothing(ledger: Ledger) -> None:
    shared_reserve(ledger, "r1", "2.5")
    with pytest.raises(PlanRefusedError) as exc:
        shared_reserve(ledger, "r2", "0.7")
    assert str(exc.value) == (f"population {POP!r}: spent ε=2.5 + planned ε=0.7 = 3.2 exceeds the cap ε_max=3.0")
    assert [c.run_id for c in ledger.charges()] == ["r1"]
    assert ledger.spent(POP) == (Decimal("2.5"), Decimal("0.000001"))
    with pytest.raises(PlanRefusedError, match=r"δ_max=0.00001"):
        shared_reserve(ledger, "r3", "0.1", delta="0.00001")
    assert len(ledger.charges()) == 1


def test_exact_decimal_sums_at_the_cap(ledger: Ledger) -> None:
    for i in range(3):
        shared_reserve(ledger, f"a{i}", "1.0")
    assert ledger.spent(POP)[0] == Decimal("3.0")  # exactly at the cap: accepted
    ledger.set_cap(
        "other", epsilon_max=3.0, delta_max=1e-5, protected_unit="row", adjacency="add_remove"
    )  # floats go through str()
    shared_reserve(ledger, "b0", 1.1, population="other")
    shared_reserve(ledger, "b1", 1.1, population="other")
    with pytest.raises(PlanRefusedError, match=r"spent ε=2.2 \+ planned ε=1.0 = 3.2 exceeds the cap ε_max=3.0"):
        shared_reserve(ledger, "b2", "1.0", population="other")
    ledger.set_cap("third", epsilon_max="0.3", delta_max="1e-5", protected_unit="row", adjacency="add_remove")
    shared_reserve(ledger, "c0", 0.1, population="third")
    shared_reserve(ledger, "c1", 0.2, population="third")  # float 0.1 + 0.2 > 0.3; Decimal is exact
    assert 0.1 + 0.2 > 0.3 and ledger.spent("third")[0] == Decimal("0.3")
    with pytest.raises(PlanRefusedError):
        ledger.check("third", epsilon="1e-30", delta=0)
    raw = sqlite3.connect(ledger.path).execute("SELECT DISTINCT typeof(epsilon) FROM charges").fetchall()
    assert raw == [("text",)]


def test_check_and_caps(ledger: Ledger) -> None:
    ledger.check(POP, epsilon="3.0", delta="1e-5")
    with pytest.raises(PlanRefusedError, match="exceeds the cap ε_max=3.0"):
        ledger.check(POP, epsilon="3.01", delta=0)
    with pytest.raises(
        PlanRefusedError,
        match=r"run `dplora ledger set-cap nobody --epsilon E --delta D --unit U \[--unit-key KEY\] "
        r"--adjacency A` first",
    ):
        ledger.check("nobody", epsilon=1, delta=0)
    with pytest.raises(PlanRefusedError, match="no privacy cap"):
        shared_reserve(ledger, "x", "1", population="nobody")
    for eps, delta in [
        ("0", "1e-5"),
        ("nan", "1e-5"),
        ("inf", "1e-5"),
        ("-1", "1e-5"),
        ("1", "1"),
        ("x", "0.1"),
    ]:
        with pytest.raises(BadInputError):
            ledger.set_cap(POP, epsilon_max=eps, delta_max=delta, protected_unit="row", adjacency="add_remove")
    assert ledger.cap(POP) == (Decimal("3.0"), Decimal("1e-5"))
    assert ledger.cap("nobody") is None
    shared_reserve(ledger, "r1", "2")
    ledger.set_cap(
        POP, epsilon_max="1.5", delta_max="1e-5", protected_unit="row", adjacency="add_remove"
    )  # lowering below spent is allowed...
    [pop] = ledger.populations()  # ...and reported
    assert pop["epsilon_left"] == "-0.5" and pop["over_cap"] is True and pop["epsilon_spent"] == "2"
    with pytest.raises(BadInputError, match="already has a charge"):
        shared_reserve(ledger, "r1", "0.1")


def test_default_ledger_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "x.db"))
    assert default_ledger_path() == tmp_path / "x.db"
    monkeypatch.delenv(LEDGER_ENV)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_ledger_path() == tmp_path / "dplora" / "ledger.sqlite3"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_ledger_path() == Path.home() / ".local/share/dplora/ledger.sqlite3"


def test_failed_and_never_settled_runs_are_charged(ledger: Ledger) -> None:
    shared_reserve(ledger, "failed", "1.0")
    shared_reserve(ledger, "killed", "1.5")  # the process dies: never settled
    charge = ledger.settle("failed", epsilon_spent="0.4", status="failed")
    assert (charge.status, charge.epsilon, charge.reserved_epsilon) == (
        "failed",
        Decimal("0.4"),
        Decimal("1.0"),
    )
    assert charge.settled_at is not None
    assert ledger.spent(POP)[0] == Decimal("1.9")  # 0.4 (failed, data touched) + 1.5 (pending at reserved)
    assert {c.run_id: c.status for c in ledger.charges(POP)} == {"failed": "failed", "killed": "pending"}
    with pytest.raises(BadInputError, match="already failed"):
        ledger.settle("failed", epsilon_spent="0.4")
    with pytest.raises(PlanRefusedError, match="more than its reserved"):
        ledger.settle("killed", epsilon_spent="1.6")
    with pytest.raises(BadInputError, match="no charge"):
        ledger.settle("ghost", epsilon_spent="0.1")
    with pytest.raises(BadInputError):
        ledger.settle("killed", epsilon_spent="0.1", status="done")
    shared_reserve(ledger, "trial", "0.5", purpose="tuning")  # tuning trials count like releases
    assert ledger.spent(POP)[0] == Decimal("2.4")
    with pytest.raises(PlanRefusedError):
        shared_reserve(ledger, "too-much", "0.7")


def test_release_is_not_a_new_charge(ledger: Ledger) -> None:
    shared_reserve(ledger, "run", "2.0", delta="1e-6")
    ledger.settle("run", epsilon_spent="1.2")
    ledger.record_release(run_id="run", record_sha256=SHA[0], epsilon="1.2", delta="1e-6", label="step-100")
    ledger.record_release(run_id="run", record_sha256=SHA[1], epsilon="1.8", delta="1e-6", label="step-200")
    ledger.record_release(run_id="run", record_sha256=SHA[1], epsilon="1.8", delta="1e-6")  # retry: no-op
    [charge] = ledger.charges(POP)
    assert charge.epsilon == Decimal("1.8")  # ε of the latest released checkpoint
    assert ledger.spent(POP) == (Decimal("1.8"), Decimal("0.000001"))
    assert [r["label"] for r in ledger.releases("run")] == ["step-100", "step-200"]
    ledger.record_release(run_id="run", record_sha256=SHA[2], epsilon="1.5", delta="1e-6")  # earlier step
    assert ledger.charges()[0].epsilon == Decimal("1.8")  # an already released ε is never un-charged
    with pytest.raises(PlanRefusedError, match="above the reserved"):
        ledger.record_release(run_id="run", record_sha256=SHA[3], epsilon="2.1", delta="1e-6")
    with pytest.raises(BadInputError, match="no charge"):
        ledger.record_release(run_id="ghost", record_sha256=SHA[4], epsilon="1", delta=0)
    with pytest.raises(BadInputError, match="64 hex"):
        ledger.record_release(run_id="run", record_sha256="abc", epsilon="1", delta=0)
    with pytest.raises(BadInputError, match="already recorded"):
        ledger.record_release(run_id="run", record_sha256=SHA[0], epsilon="1.3", delta="1e-6")
    assert len(ledger.releases()) == 3 and len(ledger.charges()) == 1


def test_release_raise_respects_the_cap(ledger: Ledger) -> None:
    shared_reserve(ledger, "run", "2.0")
    ledger.settle("run", epsilon_spent="1.0")  # frees 1.0 ...
    shared_reserve(ledger, "next", "2.0")  # ... which another run takes: total 3.0 = cap
    with pytest.raises(PlanRefusedError, match="exceeds the cap"):
        ledger.record_release(run_id="run", record_sha256=SHA[0], epsilon="1.5", delta=0)
    assert ledger.releases() == [] and ledger.spent(POP)[0] == Decimal("3.0")


def test_release_before_settle_keeps_the_reservation(ledger: Ledger) -> None:
    shared_reserve(ledger, "run", "2.0")
    ledger.record_release(run_id="run", record_sha256=SHA[0], epsilon="0.5", delta=0)
    assert ledger.charges()[0].epsilon == Decimal("2.0")  # still running: reserved ε stays charged
    assert ledger.settle("run", epsilon_spent="0.3").epsilon == Decimal("0.5")  # ≥ released ε


def test_corrupted_database_is_reported_and_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"
    garbage = b"not sqlite" + os.urandom(8192)
    db.write_bytes(garbage)
    with pytest.raises(LedgerError) as exc:
        Ledger(db)
    msg = str(exc.value)
    assert str(db) in msg and "not a valid SQLite database" in msg and "restore it from backup" in msg
    assert "\n" not in msg and exc.value.exit_code == 2
    assert db.read_bytes() == garbage


def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.commit()
    before = db.read_bytes()
    with pytest.raises(LedgerError, match="not a dplora ledger"):
        Ledger(db)
    assert db.read_bytes() == before


def test_locked_database(ledger: Ledger) -> None:
    shared_reserve(ledger, "before", "1.0")
    holder = sqlite3.connect(ledger.path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with Ledger(ledger.path, timeout_s=0.2) as busy, pytest.raises(LedgerError, match="locked") as exc:
            shared_reserve(busy, "during", "1.0")
        assert str(ledger.path) in str(exc.value) and "retry" in str(exc.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with Ledger(ledger.path) as again:
        assert [c.run_id for c in again.charges()] == ["before"]
        shared_reserve(again, "after", "1.0")
        assert again.spent(POP)[0] == Decimal("2.0")


def _cli(*args: str):
    app = typer.Typer()
    app.add_typer(ledger_app, name="ledger")

    @app.command()
    def _noop() -> None:  # a second command keeps "ledger" a sub-command, as in the real CLI
        pass

    return CliRunner().invoke(app, ["ledger", *args])


def test_cli_set_cap_show_check(db: Path) -> None:
    res = _cli("show", "--db", str(db))
    assert res.exit_code == 2 and "no ledger" in res.stderr and not db.exists()
    res = _cli(*set_cap_args(POP, db, epsilon="3.0", delta="1e-5"))
    assert res.exit_code == 0, res.output
    with Ledger(db) as led:
        shared_reserve(led, "r1", "2.5")
        led.record_release(run_id="r1", record_sha256=SHA[0], epsilon="2.5", delta="1e-6", label="final")
    res = _cli("show", "--db", str(db), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["populations"][0] == {
        "name": POP,
        "epsilon_max": "3.0",
        "delta_max": "0.00001",
        "epsilon_spent": "2.5",
        "delta_spent": "0.000001",
        "epsilon_left": "0.5",
        "delta_left": "0.000009",
        "over_cap": False,
        "protected_unit": "row",
        "unit_key": "none (row level)",
        "adjacency": "add_remove",
        "epsilon_composed": None,  # the charge has no events: basic composition only
        "composition": None,
        "composed_by": None,
        "epsilon_tightest": 2.5,
        # issue 46: no events, so no composed attack ceiling either
        "attack_ceiling": {"available": False, "reason": "a charge's mechanism or unit key is unknown (or no charges)"},
    }
    assert [c["run_id"] for c in data["charges"]] == ["r1"] and data["releases"][0]["label"] == "final"
    res = _cli("show", POP, "--db", str(db))
    assert res.exit_code == 0 and POP in res.stdout and "r1" in res.stdout
    assert _cli("check", POP, "--epsilon", "0.5", "--delta", "1e-6", "--db", str(db)).exit_code == 0
    res = _cli("check", POP, "--epsilon", "0.7", "--delta", "1e-6", "--db", str(db))
    assert res.exit_code == 2
    assert res.stderr == (f"error: population {POP!r}: spent ε=2.5 + planned ε=0.7 = 3.2 exceeds the cap ε_max=3.0\n")
    res = _cli(*set_cap_args(POP, db, epsilon="-1", delta="1e-5"))
    assert res.exit_code == 2 and res.stderr.startswith("error: epsilon_max must be > 0")


def test_cli_uses_the_env_ledger(monkeypatch: pytest.MonkeyPatch, db: Path) -> None:
    monkeypatch.setenv(LEDGER_ENV, str(db))
    assert (
        _cli(
            "set-cap", "p", "--epsilon", "1", "--delta", "1e-6", "--unit", "row", "--adjacency", "add_remove"
        ).exit_code
        == 0
    )
    res = _cli("check", "p", "--epsilon", "2", "--delta", "1e-6")
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1
