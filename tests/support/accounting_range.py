"""Helpers shared by tests/accounting/test_accounting_range.py and its slow tier under tests/slow/."""

from __future__ import annotations

import math

from conftest import ROW_PRIVACY

from dplora.accounting.backends import rdp_epsilons
from dplora.accounting.events import Accountant, DpSgdEvent
from dplora.contract.loader import parse_contract
from dplora.plan.training import make_plan

PRV, PLD, RDP = Accountant.PRV, Accountant.PLD, Accountant.RDP


def shared_plan(n, batch, steps, **privacy):
    raw = {
        "privacy": {
            **ROW_PRIVACY,
            **privacy,
        },
        "model": {"path": "/nonexistent"},
        "data": {"path": "data.csv", "prompt_column": "message", "response_column": "reply"},
        "training": {"expected_batch_size": batch, "steps": steps},
    }
    return make_plan(parse_contract(raw), num_units=n, num_units_source="contract")


def never(*_args, **_kwargs):
    raise AssertionError("a numerical accountant was called outside its range")


def assert_checked(plan):
    steps = [s for s, _ in plan.epsilon_curve]
    values = [e for _, e in plan.epsilon_curve]
    assert steps[0] == 1 and steps[-1] == plan.steps
    assert all(math.isfinite(v) for v in values)
    assert all(a <= b for a, b in zip(values, values[1:], strict=False))
    assert values[-1] == plan.epsilon <= plan.target_epsilon
    if plan.adjacency.value == "add_remove":
        event = DpSgdEvent(sample_rate=plan.sample_rate, noise_multiplier=plan.noise_multiplier, steps=plan.steps)
        assert all(v <= r for v, r in zip(values, rdp_epsilons(event, plan.delta, steps), strict=True))


EVENT = DpSgdEvent(sample_rate=0.01, noise_multiplier=1.0, steps=100)


STEPS = [1, 50, 100]


def fake_pld(values):
    def fake(event, delta, steps, interval=1e-4):
        return [values(event.noise_multiplier, t) for t in steps]

    return fake
