"""The slow tier of tests/plan/test_plan.py, whose docstring describes the module."""

from __future__ import annotations

import pytest
from support.plan import TOL, check_curve, plan, shared_users_csv, user_contract

from dplora.accounting import epsilon
from dplora.accounting.backends import pld_epsilons, rdp_epsilons
from dplora.accounting.events import Accountant, DpSgdEvent
from dplora.errors import PlanRefusedError

pytestmark = pytest.mark.usefixtures("fresh_cache")  # a calibration cache of each test's own


def test_a8_pld_plan():
    p = plan(
        1000,
        privacy={"noise_multiplier": 1.0, "target_epsilon": 10, "accountant": "pld"},
        training={"expected_batch_size": 80, "physical_batch_size": 10, "steps": 100},
    )
    assert p.accountant is Accountant.PLD
    assert p.epsilon == pytest.approx(5.61, abs=TOL)


@pytest.fixture(scope="module")
def users_csv(tmp_path_factory):
    return shared_users_csv(tmp_path_factory.mktemp("users") / "users.csv")


def test_t8_user_level_q_and_delta_over_users(users_csv):
    from dplora.data.units import count_units
    from dplora.plan.resolve import plan_for

    c = user_contract(users_csv)
    index = count_units(c.data, c.privacy, seed=0)
    assert index.num_units == 1000 and index.num_records == 10000
    p = plan_for(c, index, release=False)  # a dry run may count N
    assert p.num_units == 1000 and p.num_units_source == "data"
    assert p.sample_rate == 0.01  # 10 users / 1000 users, not 10 / 10000 rows
    assert p.protected_unit.value == "user" and p.unit_key == "user_id"
    # the T8 anchor, user-level, with PLD (the plan above is RDP for speed)
    assert epsilon(
        sample_rate=p.sample_rate, noise_multiplier=p.noise_multiplier, steps=p.steps, delta=p.delta, accountant="pld"
    ) == pytest.approx(1.83, abs=TOL)

    # δ is checked against the 1000 users: 5e-4 < 1/1000 is allowed with a warning (against the 10000 rows
    # it would be refused), 2e-3 is refused.
    warned = plan_for(user_contract(users_csv, delta=5e-4), index, release=False)
    assert len(warned.warnings) == 1 and "NIST SP 800-226" in warned.warnings[0]
    with pytest.raises(PlanRefusedError) as info:
        plan_for(user_contract(users_csv, delta=2e-3), index, release=False)
    assert "N=1000" in str(info.value) and info.value.exit_code == 2


def test_t8_user_level_pld_plan(users_csv):
    from dplora.data.units import count_units
    from dplora.plan.resolve import plan_for

    c = user_contract(users_csv, accountant="pld", target_epsilon=3.0)
    p = plan_for(c, count_units(c.data, c.privacy, seed=0), release=False)
    assert p.accountant is Accountant.PLD and p.sample_rate == 0.01
    assert p.epsilon == pytest.approx(1.83, abs=TOL)


def test_epsilon_curve_pld_every_step_is_checked():
    """ε at step 1 and at every step; each value bounds PLD's own ε there and never exceeds RDP (add/remove)."""
    p = plan(
        1000,
        privacy={"noise_multiplier": 2.0, "target_epsilon": 3.0, "accountant": "pld"},
        training={"expected_batch_size": 10, "steps": 20},
    )
    assert p.accountant is Accountant.PLD and p.accountant_note is None
    assert [s for s, _ in p.epsilon_curve] == list(range(1, 21))
    check_curve(p)
    event = DpSgdEvent(sample_rate=0.01, noise_multiplier=2.0, steps=20)
    rdp = rdp_epsilons(event, 1e-5, list(range(1, 21)))
    own = pld_epsilons(event, 1e-5, list(range(1, 21)))  # PLD's own ε at every step
    assert own[-1] == epsilon(sample_rate=0.01, noise_multiplier=2.0, steps=20, delta=1e-5, accountant="pld")
    for (t, value), pld, bound in zip(p.epsilon_curve, own, rdp, strict=True):
        assert pld - 1e-12 <= value <= bound + 1e-12, t
        assert p.epsilon_at(t) == value  # the per-step bound in metrics.jsonl is the plotted curve
    assert p.epsilon_at(1) == pytest.approx(0.028, abs=0.002)  # not the 25 % value
