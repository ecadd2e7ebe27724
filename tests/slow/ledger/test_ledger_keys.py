"""The slow tier of tests/ledger/test_ledger_keys.py, whose docstring describes the module."""

from __future__ import annotations

import shutil
import sqlite3
from decimal import Decimal
from pathlib import Path

import pytest
from support.ledger_keys import reserve, runner

from dplora.accounting.composition import compose_events
from dplora.cli.app import app
from dplora.errors import BadInputError, PlanRefusedError
from dplora.ledger.store import Ledger

MAIN_SCHEMA_3 = Path(__file__).resolve().parents[2] / "ledger" / "data" / "schema3_main.sqlite3"


def sgd(q=0.01, sigma=1.0, steps=1000):
    return {
        "mechanism": "dp_sgd",
        "sample_rate": q,
        "noise_multiplier": sigma,
        "steps": steps,
        "adjacency": "add_remove",
        "accountant": "pld",
    }


def test_a_ledger_written_by_main_is_migrated_key_unknown(tmp_path):
    """Main's schema-3 file: the user-level population becomes "key unknown" (its two charges count by basic
    composition, 3.656), the next charge is refused until it is re-pinned with an explicit key, and then the new
    charge's events are composed alone and added to the old sum. The row-level population needs no key: it keeps
    composing. Caps, charges, releases and the unassigned run are unchanged."""
    db = tmp_path / "main.sqlite3"
    shutil.copy(MAIN_SCHEMA_3, db)
    assert sqlite3.connect(db).execute("SELECT version FROM schema_version").fetchone()[0] == 3
    ledger = Ledger(db)
    assert sqlite3.connect(db).execute("SELECT version FROM schema_version").fetchone()[0] == 4
    pops = {p["name"]: p for p in ledger.populations()}
    assert pops["customers"]["unit_key"] == "key unknown" and pops["rows"]["unit_key"] == "none (row level)"
    assert pops["customers"]["epsilon_spent"] == "3.656" and pops["customers"]["epsilon_tightest"] == 3.656
    assert pops["rows"]["epsilon_tightest"] == 1.0  # row level: unchanged (basic 1.0 < composed 1.068)
    assert [(c.run_id, c.status, str(c.epsilon), c.unit_key) for c in ledger.charges()] == [
        ("main-u1", "settled", "1.828", None),
        ("main-u2", "pending", "1.828", None),
        ("main-r1", "settled", "1.0", ""),
    ]
    assert [r["label"] for r in ledger.releases()] == ["final"]
    assert [(c.run_id, c.unit_key) for c in ledger.unassigned()] == [("main-x1", None)]
    assert ledger.cap("customers") == (Decimal("10"), Decimal("0.0001"))
    with pytest.raises(PlanRefusedError, match=r"unit key unknown.*--unit-key"):
        reserve(ledger, "new", "customer_id", population="customers", events=[sgd()])
    with pytest.raises(PlanRefusedError, match="unit key unknown"):
        ledger.check(
            "customers", epsilon="1", delta="0", protected_unit="user", unit_key="customer_id", adjacency="add_remove"
        )
    ledger.set_cap(
        "customers",
        epsilon_max="10",
        delta_max="1e-4",
        protected_unit="user",
        unit_key="customer_id",
        adjacency="add_remove",
    )
    reserve(ledger, "new", "customer_id", population="customers", eps="1.828", events=[sgd()])
    total = ledger.total("customers")
    one = compose_events([sgd()], 1e-5, "add_remove")["pld"]["epsilon"]  # the new charge alone, at its own δ
    assert total["composed"]["epsilon"] == pytest.approx(3.656 + one, abs=1e-6)
    assert total["composed"]["epsilon"] > 3.656 + 1.7  # main composed all three: about 2.9
    reserve(ledger, "row-new", None, unit="row", population="rows", eps="1.0", events=[sgd(steps=300)])
    rows = compose_events([sgd(steps=300)] * 2, 2e-5, "add_remove")["pld"]["epsilon"]
    assert ledger.total("rows")["composed"]["epsilon"] == pytest.approx(rows, abs=1e-6)  # composed together
    reopened = Ledger(db)
    assert reopened.unit_key("customers") == "customer_id" and reopened.charge("new").unit_key == "customer_id"


BUDGET_CONTRACT = """\
privacy: {protected_unit: user, unit_key: KEY, adjacency: add_remove, target_epsilon: 2, delta: 1.0e-5,
          accountant: rdp, max_grad_norm: 1.0, num_units: 1000, population: p, max_records_per_unit: 4}
model: {path: /nonexistent}
data: {path: data.csv, prompt_column: message, response_column: reply}
training: {expected_batch_size: 32, steps: 24}
"""


@pytest.mark.parametrize("key", ["customer_id", "ticket_id"])
def test_budget_refuses_a_contract_keyed_on_another_column(tmp_path, monkeypatch, key):
    """The contract's privacy.unit_key reaches the ledger: pinned to customer_id, a contract keyed on ticket_id is
    refused by `dplora budget` (as by train, before any step), naming both keys."""
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    rows = [f"c{i % 40},t{i},question {i},answer {i}" for i in range(100)]
    (tmp_path / "data.csv").write_text("customer_id,ticket_id,message,reply\n" + "\n".join(rows) + "\n")
    (tmp_path / "c.yaml").write_text(BUDGET_CONTRACT.replace("KEY", key))
    db = tmp_path / "l.db"
    Ledger(db).set_cap(
        "p", epsilon_max="10", delta_max="1e-4", protected_unit="user", unit_key="customer_id", adjacency="add_remove"
    )
    result = runner.invoke(app, ["budget", "c.yaml", "--ledger", str(db)])
    if key == "customer_id":
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "unit key customer_id" in result.output and "unit key ticket_id" in result.output


def test_random_pins_and_charges_never_mix_two_keys_in_one_population(tmp_path):
    """Attack: 200 random set-cap / reserve calls (units row, ticket, user; keys customer_id, ticket_id, none)
    on two populations, starting from main's schema-3 file. Whatever is accepted, no population ever holds charges
    of two known unit keys or of a key other than its pin, and every refusal names the keys it compared."""
    import random

    db = tmp_path / "main.sqlite3"
    shutil.copy(MAIN_SCHEMA_3, db)
    ledger, rng = Ledger(db), random.Random(41)
    for n in range(200):
        pop, unit = rng.choice(["customers", "rows"]), rng.choice(["row", "ticket", "user"])
        key = None if unit == "row" else rng.choice(["customer_id", "ticket_id"])
        try:
            if rng.random() < 0.3:
                ledger.set_cap(
                    pop, epsilon_max="1000", delta_max="0.5", protected_unit=unit, unit_key=key, adjacency="add_remove"
                )
            else:
                reserve(ledger, f"r{n}", key, unit=unit, population=pop, eps="0.1")  # basic only: fast
        except PlanRefusedError as err:
            assert "unit key" in str(err) or "protected unit" in str(err), str(err)
        except BadInputError as err:
            assert "keyed by" in str(err) or "protected unit" in str(err), str(err)
    for pop in ("customers", "rows"):
        known = {(c.protected_unit, c.unit_key) for c in ledger.charges(pop) if c.unit_key is not None}
        assert len(known) <= 1, (pop, known)
        if known:
            assert known == {(ledger.pinned(pop)[0], ledger.unit_key(pop))}
    assert sum(c.unit_key not in (None, "") for c in ledger.charges()) >= 5  # keyed charges were accepted too
