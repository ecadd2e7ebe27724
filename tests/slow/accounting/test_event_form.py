"""The slow tier of tests/accounting/test_event_form.py, whose docstring describes the module."""

from __future__ import annotations

import dataclasses

import pytest
from support.event_form import EVENT

from dplora.accounting.composition import compose_events, dp_event_of, validate_events
from dplora.accounting.events import DpSgdEvent
from dplora.plan.training import TrainingPlan, ledger_event


def _plan(tmp_path, monkeypatch) -> TrainingPlan:
    """A real plan (make_plan on a parsed contract): replace-one, N 800, B 50, T 37, σ 1.0, PLD at ε 4."""
    from dplora.contract.loader import parse_contract
    from dplora.plan.training import make_plan

    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))
    raw = {
        "privacy": {
            "protected_unit": "row",
            "adjacency": "replace_one",
            "target_epsilon": 4.0,
            "delta": 1e-5,
            "accountant": "pld",
            "max_grad_norm": 0.1,
            "num_units": 800,
            "noise_multiplier": 1.0,  # stated: the plan checks ε(σ, T) ≤ target instead of calibrating
        },
        "model": {"path": "/nonexistent"},
        "data": {"path": "data.csv", "prompt_column": "message", "response_column": "reply"},
        "training": {"expected_batch_size": 50, "steps": 37},
    }
    return make_plan(parse_contract(raw), num_units=800, num_units_source="contract")


def test_the_ledger_stores_the_records_form_and_composition_reads_it(tmp_path, monkeypatch):
    plan = _plan(tmp_path, monkeypatch)
    event = dataclasses.replace(EVENT, noise_multiplier=plan.noise_multiplier)
    charge = ledger_event(plan)
    assert charge == {**plan.event.to_dict(), "accountant": "pld"} == {**event.to_dict(), "accountant": "pld"}
    assert plan.to_dict()["event"] == event.to_dict()  # the record's mechanism entry
    assert DpSgdEvent.from_dict(charge) == event
    assert validate_events([charge], "replace_one") == [charge]
    assert dp_event_of(charge) == event.to_dp_accounting()
    # composing the ledger's form gives the event's own PLD ε
    from dplora.accounting.backends import epsilons
    from dplora.accounting.events import Accountant

    pld = compose_events([charge], 1e-5, "replace_one")["pld"]["epsilon"]
    assert pld == pytest.approx(epsilons(event, 1e-5, Accountant.PLD, [37])[0], rel=1e-9)
