"""Helpers shared by tests/plan/test_planner.py and its slow tier under tests/slow/."""

from __future__ import annotations

from conftest import contract_dict

ARGS = {"num_units": 1000, "target_epsilon": 8.0, "delta": 1e-5, "accountant": "rdp", "adjacency": "add_remove"}


def auto(tmp_path, tiny_model_dir, data, **training):
    raw = contract_dict(tiny_model_dir, data, tmp_path / "out", privacy={"num_units": 800})
    raw["training"].pop("steps")
    raw["training"].update({"expected_batch_size": "auto", "steps": "auto"} | training)
    return raw
