"""The slow tier of tests/ledger/test_ledger_units.py, whose docstring describes the module."""

from __future__ import annotations

import sqlite3
from decimal import Decimal

import pytest
from support.ledger_units import OLD_SCHEMA, reserve

from dplora.accounting.composition import compose_events
from dplora.errors import PlanRefusedError
from dplora.ledger.store import Ledger


def sgd(q, sigma, steps, adjacency="add_remove"):
    return {
        "mechanism": "dp_sgd",
        "sample_rate": q,
        "noise_multiplier": sigma,
        "steps": steps,
        "adjacency": adjacency,
        "accountant": "pld",
    }


def test_f6_composed_numbers():
    """F6: the composed ε at total δ 1e-5 is 2.584 (and 2.303), far below the sum 3.656 (valid only at 2e-5)."""
    assert compose_events([sgd(0.01, 1.0, 1000)] * 2, 1e-5, "add_remove")["pld"]["epsilon"] == pytest.approx(
        2.584, abs=0.02
    )
    two = compose_events([sgd(0.01, 1.0, 1000), sgd(0.02, 1.5, 500)], 1e-5, "add_remove")
    assert two["pld"]["epsilon"] == pytest.approx(2.303, abs=0.02)


def test_f6_two_releases_fit_a_cap_the_sum_exceeds(tmp_path):
    """Two F6 releases (ε 1.828, δ 1e-5 each) under a cap ε 3, δ 2e-5: basic 3.656 is over, composed fits."""
    ledger = Ledger(tmp_path / "l.db")
    ledger.set_cap("p", epsilon_max="3", delta_max="2e-5", protected_unit="row", adjacency="add_remove")
    reserve(ledger, "a", "1.828", events=[sgd(0.01, 1.0, 1000)])
    reserve(ledger, "b", "1.828", events=[sgd(0.01, 1.0, 1000)])  # refused on main by the sum 3.656 > 3
    total = ledger.total("p")
    assert total["basic"] == {"epsilon": "3.656", "delta": "0.00002", "method": total["basic"]["method"]}
    composed = total["composed"]
    assert composed["delta"] == "0.00002"  # the same total δ as the basic sum
    at_2e5 = compose_events([sgd(0.01, 1.0, 1000)] * 2, 2e-5, "add_remove")["pld"]["epsilon"]
    assert composed["epsilon"] == pytest.approx(at_2e5, abs=1e-9) and composed["epsilon"] < 2.584
    assert total["epsilon"] == composed["epsilon"]
    (pop,) = ledger.populations()
    assert pop["epsilon_spent"] == "3.656" and pop["over_cap"] is False
    assert pop["epsilon_composed"] == pytest.approx(at_2e5, abs=1e-9)
    with pytest.raises(PlanRefusedError, match="composed"):  # a third one is over by both
        reserve(ledger, "c", "1.828", events=[sgd(0.01, 1.0, 1000)])


def test_schema_1_ledger_is_migrated_as_unit_unknown(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SCHEMA)
    conn.close()
    ledger = Ledger(path)
    (pop,) = ledger.populations()
    assert pop["protected_unit"] == "unit unknown" and pop["epsilon_spent"] == "1.828"
    assert ledger.charges("p")[0].protected_unit is None and ledger.charges("p")[0].events is None
    with pytest.raises(PlanRefusedError, match="unit unknown"):
        reserve(ledger, "new", "1.0", events=[sgd(0.01, 1.0, 1000)])
    ledger.set_cap("p", epsilon_max="4", delta_max="1e-4", protected_unit="row", adjacency="add_remove")
    reserve(ledger, "new", "1.828", events=[sgd(0.01, 1.0, 1000)])
    total = ledger.total("p")
    # the old charge has no events: it is added by basic composition to the composed new one
    assert total["composed"]["epsilon"] == pytest.approx(1.828 + 1.828, abs=0.01)
    assert "basic for charges without events" in total["composed"]["method_short"]
    assert Ledger(path).pinned("p") == ("row", "add_remove")
    assert sqlite3.connect(path).execute("SELECT version FROM schema_version").fetchone()[0] == 4  # 1 → 2 → 3 → 4


def test_cli_set_cap_requires_unit_and_show_prints_both(tmp_path):
    from typer.testing import CliRunner

    from dplora.cli.app import app

    db, runner = str(tmp_path / "l.db"), CliRunner()
    missing = runner.invoke(app, ["ledger", "set-cap", "p", "--epsilon", "3", "--delta", "2e-5", "--db", db])
    assert missing.exit_code == 2 and "--unit" in missing.output
    args = ["ledger", "set-cap", "p", "--epsilon", "3", "--delta", "2e-5", "--unit", "row", "--adjacency", "add_remove"]
    assert runner.invoke(app, [*args, "--db", db]).exit_code == 0
    ledger = Ledger(tmp_path / "l.db")
    reserve(ledger, "a", "1.828", events=[sgd(0.01, 1.0, 1000)])
    reserve(ledger, "b", "1.828", events=[sgd(0.01, 1.0, 1000)])
    shown = runner.invoke(app, ["ledger", "show", "--db", db])
    assert shown.exit_code == 0
    # one ε is "spent": the tighter total that the cap check counts (issue 42.10), both totals below it
    composed = ledger.populations()[0]["epsilon_composed"]
    assert 2.4 <= composed < 2.5
    spent = Decimal(format(composed, ".4f"))
    assert f"ε spent {spent} of cap 3, left {Decimal(3) - spent} (the tighter total" in shown.output
    assert "      basic 3.656; composed 2.4" in shown.output
    assert "protected unit row, unit key none (row level), adjacency add_remove" in shown.output
    assert Decimal(ledger.populations()[0]["epsilon_left"]) < 0  # the basic view is over; the cap check is not
