"""Helpers shared by tests/ledger/test_ledger_units.py and its slow tier under tests/slow/."""

from __future__ import annotations

from conftest import reserve_charge


def reserve(ledger, run, eps, unit="row", events=None, delta="1e-5", adjacency="add_remove"):
    unit_key = None if unit == "row" else "user_id"
    return reserve_charge(
        ledger,
        "p",
        run,
        eps,
        delta,
        accountant="pld",
        adjacency=adjacency,
        protected_unit=unit,
        unit_key=unit_key,
        events=events,
    )


OLD_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE populations (
    name TEXT PRIMARY KEY, epsilon_max TEXT NOT NULL, delta_max TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE charges (
    run_id TEXT PRIMARY KEY, population TEXT NOT NULL, epsilon TEXT NOT NULL, delta TEXT NOT NULL,
    reserved_epsilon TEXT NOT NULL, spent_epsilon TEXT,
    status TEXT NOT NULL CHECK (status IN ('pending', 'settled', 'failed')),
    purpose TEXT NOT NULL CHECK (purpose IN ('release', 'tuning')),
    accountant TEXT NOT NULL, adjacency TEXT NOT NULL, created_at TEXT NOT NULL, settled_at TEXT);
CREATE TABLE releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES charges (run_id),
    record_sha256 TEXT NOT NULL, epsilon TEXT NOT NULL, delta TEXT NOT NULL, label TEXT NOT NULL,
    created_at TEXT NOT NULL, UNIQUE (run_id, record_sha256));
INSERT INTO schema_version VALUES (1);
INSERT INTO populations VALUES ('p', '3', '1e-4', '2026-01-01T00:00:00+00:00');
INSERT INTO charges VALUES ('old', 'p', '1.828', '1e-5', '1.828', '1.828', 'settled', 'release', 'pld',
    'add_remove', '2026-01-01T00:00:00+00:00', '2026-01-01T00:00:00+00:00');
"""
