"""The planner on ../shared/cases/README.md F8's inputs (N 4214, δ 1e-6, 3 epochs, T = round(3N/B), PLD) gives F8's
σ within ±0.005 and ε ≤ target (issue 43: σ/B at fixed epochs, McKenna et al. 2025)."""

from __future__ import annotations

import pytest
from support.plan import contract as planning_contract

from dplora.plan.training import make_plan

N = 4214
# B: (T, σ at ε 8, σ at ε 3), F8's table
F8 = {32: (395, 0.5283, 0.7264), 128: (99, 0.6354, 0.9369), 512: (25, 0.8212, 1.3939), 1024: (12, 0.9482, 1.7545)}


def _contract(batch: int, steps: int, epsilon: float):
    privacy = {"target_epsilon": epsilon, "delta": 1e-6, "accountant": "pld", "num_units": N}
    return planning_contract(privacy=privacy, training={"expected_batch_size": batch, "steps": steps})


@pytest.mark.parametrize("batch", sorted(F8))
@pytest.mark.parametrize("epsilon", [8.0, 3.0])
def test_planner_reproduces_f8_sigma(batch, epsilon):
    steps, sigma8, sigma3 = F8[batch]
    assert steps == round(3 * N / batch)
    plan = make_plan(_contract(batch, steps, epsilon), num_units=N, num_units_source="contract")
    want = sigma8 if epsilon == 8.0 else sigma3
    assert plan.sample_rate == pytest.approx(batch / N, rel=1e-12) and plan.steps == steps
    assert abs(plan.noise_multiplier - want) <= 0.005
    assert plan.epsilon <= epsilon
