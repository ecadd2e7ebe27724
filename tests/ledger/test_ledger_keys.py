"""Issue 41, item 4: a population is pinned by (protected unit, unit key), not the unit's label alone.

On main a population pinned to ``user`` accepted a run keyed on ``customer_id`` and one keyed on ``ticket_id`` (really
ticket level) and composed them as one customer-level total; by group privacy the second alone is worth k·ε for a
customer with k tickets. ``schema3_main.sqlite3`` was written by main (commit 059e784, schema 3) before the change:
a user-level population ``customers`` (cap ε 10, δ 1e-4; a settled charge ε 1.828 with a release and a pending one,
both PLD events q 0.01, σ 1, T 1000), a row-level population ``rows`` (cap ε 5; one charge ε 1.0, T 300) and an
unassigned user-level run ``main-x1`` (ε 2.0).
"""

from __future__ import annotations

import json

import pytest
from support.ledger_keys import reserve, runner

from dplora.cli.app import app
from dplora.errors import BadInputError, PlanRefusedError
from dplora.ledger.store import Ledger


def test_a_charge_keyed_on_another_column_is_refused_naming_both_keys(tmp_path):
    ledger = Ledger(tmp_path / "l.db")
    ledger.set_cap(
        "p", epsilon_max="10", delta_max="1e-4", protected_unit="user", unit_key="customer_id", adjacency="add_remove"
    )
    reserve(ledger, "by-customer", "customer_id")
    with pytest.raises(PlanRefusedError) as info:
        reserve(ledger, "by-ticket", "ticket_id")
    assert "unit key customer_id" in str(info.value) and "unit key ticket_id" in str(info.value)
    assert info.value.exit_code == 2
    with pytest.raises(PlanRefusedError, match="unit key ticket_id"):
        ledger.check("p", epsilon="0.1", delta="0", protected_unit="user", unit_key="ticket_id", adjacency="add_remove")
    ledger.check("p", epsilon="0.1", delta="0", protected_unit="user", unit_key="customer_id", adjacency="add_remove")
    assert [c.run_id for c in ledger.charges("p")] == ["by-customer"]
    assert ledger.charges("p")[0].unit_key == "customer_id" and ledger.unit_key("p") == "customer_id"
    with pytest.raises(BadInputError, match="charges keyed by customer_id"):  # no re-pin over charges of another key
        ledger.set_cap(
            "p", epsilon_max="10", delta_max="1e-4", protected_unit="user", unit_key="ticket_id", adjacency="add_remove"
        )
    assert ledger.unit_key("p") == "customer_id"


def test_the_pin_needs_a_key_above_row_level_and_none_at_row_level(tmp_path):
    ledger = Ledger(tmp_path / "l.db")
    with pytest.raises(BadInputError, match="protected unit user needs a unit key"):
        ledger.set_cap("p", epsilon_max="1", delta_max="1e-5", protected_unit="user", adjacency="add_remove")
    with pytest.raises(BadInputError, match="protected unit row has no unit key"):
        ledger.set_cap(
            "p", epsilon_max="1", delta_max="1e-5", protected_unit="row", unit_key="id", adjacency="add_remove"
        )
    ledger.set_cap("r", epsilon_max="3", delta_max="1e-4", protected_unit="row", adjacency="add_remove")
    reserve(ledger, "row-run", None, unit="row", population="r")
    with pytest.raises(BadInputError, match="protected unit user needs a unit key"):
        reserve(ledger, "no-key", None, population="r")
    assert ledger.unit_key("r") == "" and ledger.pinned("r") == ("row", "add_remove")


def test_cli_set_cap_pins_the_key_and_show_prints_it(tmp_path):
    db = str(tmp_path / "l.db")
    base = ["ledger", "set-cap", "p", "--epsilon", "3", "--delta", "1e-4", "--unit", "user", "--adjacency"]
    missing = runner.invoke(app, [*base, "add_remove", "--db", db])
    assert missing.exit_code == 2 and "needs a unit key" in missing.output and "Traceback" not in missing.output
    ok = runner.invoke(app, [*base, "add_remove", "--unit-key", "customer_id", "--db", db])
    assert ok.exit_code == 0, ok.output
    assert "protected unit user (unit key customer_id)" in ok.output
    reserve(Ledger(tmp_path / "l.db"), "a", "customer_id")
    shown = runner.invoke(app, ["ledger", "show", "--db", db])
    assert "protected unit user, unit key customer_id, adjacency add_remove" in shown.output
    doc = json.loads(runner.invoke(app, ["ledger", "show", "--db", db, "--json"]).stdout)
    assert doc["populations"][0]["unit_key"] == "customer_id" and doc["charges"][0]["unit_key"] == "customer_id"
