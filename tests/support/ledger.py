"""Helpers shared by tests/ledger/test_ledger.py and its slow tier under tests/slow/."""

from __future__ import annotations

from pathlib import Path

import pytest

from dplora.ledger.store import Ledger

POP = "support-tickets-eu"


SHA = [f"{i:064x}" for i in range(100)]


def shared_reserve(ledger: Ledger, run_id: str, epsilon, delta="1e-6", **kw):
    kw.setdefault("population", POP)
    return ledger.reserve(
        protected_unit="row",
        run_id=run_id,
        epsilon=epsilon,
        delta=delta,
        accountant="rdp",
        adjacency="add-remove",
        **kw,
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "ledger" / "ledger.sqlite3"


@pytest.fixture
def ledger(db: Path):
    with Ledger(db) as led:
        led.set_cap(POP, epsilon_max="3.0", delta_max="1e-5", protected_unit="row", adjacency="add_remove")
        yield led
