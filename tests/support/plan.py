"""Helpers shared by tests/plan/test_plan.py and its slow tier under tests/slow/."""

from __future__ import annotations

import pytest
from conftest import ROW_PRIVACY

from dplora.contract.loader import parse_contract
from dplora.errors import PlanRefusedError
from dplora.plan.training import make_plan

TOL = 0.02


def contract(privacy=None, training=None, data=None):
    raw = {
        "privacy": {
            **ROW_PRIVACY,
            "accountant": "rdp",
        },
        "model": {"path": "/nonexistent"},
        "data": {"path": "data.csv", "prompt_column": "message", "response_column": "reply"},
        "training": {"expected_batch_size": 32, "steps": 24},
    }
    raw["privacy"].update(privacy or {})
    raw["training"].update(training or {})
    raw["data"].update(data or {})
    if "epochs" in (training or {}):
        raw["training"].pop("steps")
    return parse_contract(raw)


def plan(n, privacy=None, training=None, source="contract"):
    return make_plan(contract(privacy, training), num_units=n, num_units_source=source)


def shared_users_csv(path, users=1000, rows_per_user=10):
    lines = ["user_id,message,reply"]
    lines += [f"u{u},hello {u} {r},hi {r}" for u in range(users) for r in range(rows_per_user)]
    path.write_text("\n".join(lines) + "\n")
    return path


def user_contract(path, **privacy):
    return contract(
        privacy={"protected_unit": "user", "unit_key": "user_id", "noise_multiplier": 1.0, **privacy},
        training={"expected_batch_size": 10, "steps": 1000},
        data={"path": str(path)},
    )


@pytest.fixture(scope="module")
def users_csv(tmp_path_factory):
    return shared_users_csv(tmp_path_factory.mktemp("users") / "users.csv")


def check_curve(p):
    assert p.epsilon_curve[-1] == (p.steps, p.epsilon)
    assert p.epsilon <= p.target_epsilon
    assert p.epsilon_at(0) == 0.0
    values = [p.epsilon_at(t) for t in range(0, p.steps + 1)]
    assert all(a <= b for a, b in zip(values, values[1:], strict=False))
    assert values[-1] == p.epsilon
    with pytest.raises(PlanRefusedError):
        p.epsilon_at(p.steps + 1)
