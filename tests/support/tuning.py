"""Helpers shared by tests/tuning/test_tuning.py and its slow tier under tests/slow/."""

from __future__ import annotations

from conftest import contract_dict, write_contract


def auto_sweep_contract(tmp_path, tiny_model_dir, tickets_csv, db, cap: str):
    from dplora.ledger.store import Ledger

    Ledger(db).set_cap("tickets", epsilon_max=cap, delta_max="1e-3", protected_unit="row", adjacency="add_remove")
    raw = contract_dict(
        tiny_model_dir,
        tickets_csv,
        tmp_path / "unused",
        privacy={"population": "tickets", "num_units": 1000},
        training={"expected_batch_size": "auto", "steps": 60},
    )
    return write_contract(tmp_path / "sweep.yaml", raw)
