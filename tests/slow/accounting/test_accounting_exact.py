"""The slow tier of tests/accounting/test_accounting_exact.py, whose docstring describes the module."""

from __future__ import annotations

import pytest

import dplora.accounting.cost as cost
from dplora.contract.loader import parse_contract
from dplora.plan.training import make_plan

pytestmark = pytest.mark.usefixtures("fresh_cache")  # a calibration cache of each test's own


def test_loose_calibration_says_so_in_the_accountant_note(monkeypatch):
    """With a limit too small for PLD below some σ, replace-one calibration stops at the range edge: the plan's
    accountant_note says the tolerance was not reached (main returned the loose σ without a word)."""
    monkeypatch.setattr(cost, "PLD_MAX_SECONDS", 0.3)
    raw = {
        "privacy": {
            "protected_unit": "row",
            "adjacency": "replace_one",
            "accountant": "pld",
            "target_epsilon": 8.0,
            "delta": 1e-5,
            "max_grad_norm": 1.0,
        },
        "model": {"path": "/nonexistent"},
        "data": {"path": "data.csv", "prompt_column": "message", "response_column": "reply"},
        "training": {"expected_batch_size": 100, "steps": 10},
    }
    plan = make_plan(parse_contract(raw), num_units=1000, num_units_source="contract")
    assert plan.epsilon <= 8.0
    assert plan.accountant_note is not None and "did not reach its tolerance" in plan.accountant_note
