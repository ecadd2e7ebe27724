"""The ledger composes like units (issue 23, item 3): pinned unit and adjacency, stored events, composed totals.

References: ../shared/cases/README.md F6 (dp-accounting 0.6.0 PLD): two releases at q 0.01, σ 1, T 1000 (ε 1.828
each at δ 1e-5) compose to ε 2.584 at total δ 1e-5; with q 0.02, σ 1.5, T 500 as the second, 2.303.
"""

from __future__ import annotations

import sqlite3

import pytest
from support.ledger_units import OLD_SCHEMA, reserve

from dplora.errors import PlanRefusedError
from dplora.ledger.store import Ledger


def test_user_then_row_charge_is_refused_naming_both(tmp_path):
    """Cap ε 3 on a user-level population: a user-level run at ε 1.0 fits, a row-level run at ε 1.5 is refused
    (main accepted it, showing 2.5 ≤ 3), and the error names both units."""
    ledger = Ledger(tmp_path / "l.db")
    ledger.set_cap(
        "p", epsilon_max="3", delta_max="1e-4", protected_unit="user", adjacency="add_remove", unit_key="user_id"
    )
    reserve(ledger, "u", "1.0", unit="user")
    with pytest.raises(PlanRefusedError) as info:
        reserve(ledger, "r", "1.5", unit="row")
    assert info.value.exit_code == 2
    assert "protected unit user" in str(info.value) and "protected unit row" in str(info.value)
    with pytest.raises(PlanRefusedError, match="adjacency replace_one"):
        reserve(ledger, "x", "0.5", unit="user", adjacency="replace_one")
    with pytest.raises(PlanRefusedError, match="protected unit row"):
        ledger.check("p", epsilon="0.1", delta="0", protected_unit="row", adjacency="add_remove")
    assert [c.run_id for c in ledger.charges("p")] == ["u"]


def test_schema_1_charges_keep_their_adjacency_when_pinned(tmp_path):
    """Red-team case: schema-1 charges store the adjacency (not the unit); pinning the population to the other
    adjacency was accepted (the check skipped charges without a unit) and a new charge was summed with them."""
    from dplora.errors import BadInputError

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SCHEMA.replace("'pld',\n    'add_remove'", "'pld',\n    'replace_one'"))
    conn.close()
    ledger = Ledger(path)
    assert ledger.charges("p")[0].adjacency == "replace_one"
    with pytest.raises(BadInputError, match="protected unit unknown, adjacency replace_one"):
        ledger.set_cap("p", epsilon_max="4", delta_max="1e-4", protected_unit="row", adjacency="add_remove")
    assert Ledger(path).pinned("p") == (None, None)
    ledger.set_cap("p", epsilon_max="4", delta_max="1e-4", protected_unit="row", adjacency="replace_one")
    assert Ledger(path).pinned("p") == ("row", "replace_one")
