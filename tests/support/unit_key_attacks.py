"""Helpers shared by the unit-key attacks: tests/data/test_unit_key_attacks.py (and its slow tier under tests/slow/),
tests/run/test_resume_unit_key_attacks.py, tests/synth/test_verbatim_check_attacks.py and
tests/ledger/test_control_charge_attacks.py."""

from __future__ import annotations

from pathlib import Path

from dplora.contract.loader import parse_contract

SEED = 7


def write_csv(path: Path, header: str, rows: list[str]) -> str:
    """``header`` and ``rows`` written to ``path`` as lines; returns the path as text."""
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return str(path)


def unit_contract(tmp_path: Path, data_path: str, *, unit="user", key="user_id", privacy=None, **data):
    """A parsed message/reply contract over ``data_path`` protecting ``unit`` keyed by ``key`` (none for rows)."""
    priv = {"protected_unit": unit, "adjacency": "add_remove", "target_epsilon": 8, "delta": 1e-5,
            "max_grad_norm": 1.0, "num_units": 50, **(privacy or {})}  # fmt: skip
    if key:
        priv.update(unit_key=key, max_records_per_unit=3)
    raw = {
        "privacy": priv,
        "model": {"path": "/nonexistent"},
        "data": {"path": data_path, "prompt_column": "message", "response_column": "reply", **data},
        "training": {"expected_batch_size": 8, "steps": 5, "seed": SEED, "output_dir": str(tmp_path / "out")},
    }
    return parse_contract(raw)
