"""Helpers shared by tests/ledger/test_ledger.py and its slow tier under tests/slow/."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import reserve_charge

from dplora.ledger.store import Ledger

POP = "support-tickets-eu"


SHA = [f"{i:064x}" for i in range(100)]


def shared_reserve(ledger: Ledger, run_id: str, epsilon, delta="1e-6", **kw):
    population = kw.pop("population", POP)
    return reserve_charge(ledger, population, run_id, epsilon, delta, adjacency="add-remove", **kw)


# the fixtures both tiers use, bound in each module as ``db = ledger_db`` and ``ledger = capped_ledger``
@pytest.fixture
def ledger_db(tmp_path: Path) -> Path:
    return tmp_path / "ledger" / "ledger.sqlite3"


@pytest.fixture
def capped_ledger(db: Path):
    with Ledger(db) as led:
        led.set_cap(POP, epsilon_max="3.0", delta_max="1e-5", protected_unit="row", adjacency="add_remove")
        yield led
