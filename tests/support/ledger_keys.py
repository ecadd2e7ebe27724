"""Helpers shared by tests/ledger/test_ledger_keys.py and tests/slow/ledger/test_ledger_keys.py (its slow tier)."""

from __future__ import annotations

from typer.testing import CliRunner

runner = CliRunner()


def reserve(ledger, run, key, *, unit="user", eps="1.0", population="p", events=None):
    return ledger.reserve(
        population=population,
        run_id=run,
        epsilon=eps,
        delta="1e-5",
        accountant="pld",
        adjacency="add_remove",
        protected_unit=unit,
        unit_key=key,
        events=events,
    )
