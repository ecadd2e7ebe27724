"""The training plan: N, q, T, σ and δ checks from a contract (cases A6, A7, A8, T8). Loads no model."""

from __future__ import annotations

import json
import math

import pytest
from support.plan import TOL, check_curve, contract, plan, shared_users_csv, user_contract

from dplora.accounting import epsilon
from dplora.accounting.events import Accountant
from dplora.contract.loader import parse_contract
from dplora.errors import BadInputError, PlanRefusedError
from dplora.plan.training import check_delta, make_plan, planned_steps

pytestmark = pytest.mark.usefixtures("fresh_cache")  # a calibration cache of each test's own


@pytest.mark.parametrize(
    ("epochs", "n", "batch", "steps"),
    [
        (3, 1000, 64, 47),  # ceil(3000/64)
        (0.1, 10, 3, 1),  # ceil(1/3)
        (2.3, 1000, 10, 230),
        (2.3, 100, 1, 230),  # 2.3 * 100 = 229.99999999999997 in floats: int() would give 229
        (1.1, 100, 10, 11),  # 1.1 * 100 / 10 = 11.000000000000002 in floats: ceil() would give 12
        (2.2, 100, 2, 110),  # float ceil would give 111
        (1, 1000, 1000, 1),
        (0.5, 60000, 256, 118),  # ceil(30000/256) = ceil(117.19)
    ],
)
def test_epochs_to_steps_exact(epochs, n, batch, steps):
    c = contract(training={"epochs": epochs, "expected_batch_size": batch})
    assert planned_steps(c, n) == steps
    assert isinstance(planned_steps(c, n), int)


def test_epochs_plan_uses_integer_steps():
    p = plan(
        1000, privacy={"noise_multiplier": 1.0, "target_epsilon": 50}, training={"epochs": 3, "expected_batch_size": 64}
    )
    assert p.steps == 47 and isinstance(p.steps, int)
    assert p.epsilon_curve[-1][0] == 47


def test_steps_given_directly():
    assert planned_steps(contract(training={"steps": 123}), 1000) == 123


def test_a7_sample_rate_from_contract():
    p = plan(1000, privacy={"noise_multiplier": 1.0}, training={"expected_batch_size": 64})
    assert p.sample_rate == 0.064  # not 1/len(loader) = 1/15 = 0.0667
    assert p.expected_batch_size == 64 and p.num_units == 1000


def test_a7_batch_above_n_refused():
    with pytest.raises(PlanRefusedError) as info:
        plan(50, training={"expected_batch_size": 64})
    msg = str(info.value)
    assert "expected_batch_size=64" in msg and "N=50" in msg and "domain" not in msg
    assert info.value.exit_code == 2


def test_a7_q_equal_one_is_valid():
    p = plan(
        1000,
        privacy={"noise_multiplier": 1.0, "target_epsilon": 20},
        training={"expected_batch_size": 1000, "steps": 10},
    )
    assert p.sample_rate == 1.0
    assert p.epsilon == pytest.approx(19.05, abs=TOL)


def test_no_units_is_bad_input():
    with pytest.raises(BadInputError):
        plan(0)


def test_a8_physical_batch_does_not_enter_accounting():
    p = plan(
        1000,
        privacy={"noise_multiplier": 1.0, "target_epsilon": 10},
        training={"expected_batch_size": 80, "physical_batch_size": 10, "steps": 100},
    )
    assert p.sample_rate == 0.08 and p.steps == 100
    assert p.epsilon == pytest.approx(6.34, abs=TOL)  # RDP; the micro-batch q=0.01 would give far less
    same = plan(
        1000,
        privacy={"noise_multiplier": 1.0, "target_epsilon": 10},
        training={"expected_batch_size": 80, "physical_batch_size": 80, "steps": 100},
    )
    assert same.epsilon == p.epsilon and same.sample_rate == p.sample_rate


@pytest.mark.parametrize("delta", [1e-3, 2e-3, 0.5])
def test_delta_at_or_above_one_over_n_refused(delta):
    with pytest.raises(PlanRefusedError) as info:
        plan(1000, privacy={"delta": delta})
    assert "1/N" in str(info.value) and info.value.exit_code == 2


def test_delta_warning_not_well_below_one_over_n():
    p = plan(1000, privacy={"delta": 5e-4, "noise_multiplier": 1.0})
    (warning,) = p.warnings
    assert "NIST SP 800-226" in warning and "1/N²" in warning and "1/(N·ln N)" in warning
    assert "1e-06" in warning  # 1/N² for N=1000


def test_no_warning_when_delta_well_below():
    assert plan(1000, privacy={"delta": 1e-5, "noise_multiplier": 1.0}).warnings == ()
    assert check_delta(1e-4, 1000) == []  # exactly 0.1/N: no warning
    assert len(check_delta(1.01e-4, 1000)) == 1


@pytest.fixture(scope="module")
def users_csv(tmp_path_factory):
    return shared_users_csv(tmp_path_factory.mktemp("users") / "users.csv")


@pytest.mark.parametrize(
    ("declared", "warning"),
    [(1000, None), (1999, None), (2001, "fewer than half"), (999, "more protected units")],
)
def test_a_declared_n_far_from_the_data_warns_locally(users_csv, declared, warning):
    """1,000 users in the data: a declared N over twice that (batches far smaller than B) or under it warns on the
    local log only, never with the count; q, T and σ always use the declared N."""
    from dplora.data.units import count_units
    from dplora.plan.resolve import plan_for

    c = user_contract(users_csv, num_units=declared)
    lines = []
    p = plan_for(c, count_units(c.data, c.privacy, seed=0), release=True, log=lines.append)
    assert p.num_units == declared and p.num_units_source == "contract" and p.sample_rate == 10 / declared
    if warning is None:
        assert lines == []
    else:
        assert len(lines) == 1 and warning in lines[0] and "1000 " not in lines[0] and "1,000" not in lines[0]
    assert not any(warning and warning in w for w in p.warnings)  # never a plan warning (those are released)


def test_given_noise_over_target_refused():
    with pytest.raises(PlanRefusedError) as info:
        plan(1000, privacy={"noise_multiplier": 0.5, "target_epsilon": 1.0})
    assert "noise_multiplier" in str(info.value) and info.value.exit_code == 2


def test_given_noise_under_target_kept():
    p = plan(1000, privacy={"noise_multiplier": 1.0, "target_epsilon": 8.0})
    assert p.noise_multiplier == 1.0 and p.noise_source == "contract"


def test_calibrated_plan_meets_target():
    p = plan(1000, privacy={"target_epsilon": 3.0}, training={"expected_batch_size": 10, "steps": 1000})
    assert p.noise_source == "calibrated"
    assert p.epsilon <= 3.0
    recomputed = epsilon(
        sample_rate=0.01, noise_multiplier=p.noise_multiplier, steps=1000, delta=1e-5, accountant="rdp"
    )
    assert p.epsilon == pytest.approx(recomputed, abs=1e-12)
    assert p.accountant is Accountant.RDP and p.accountant_version.startswith("opacus ")
    assert p.accountant_note is None


def test_unreachable_target_refused():
    with pytest.raises(PlanRefusedError):
        plan(1000, privacy={"target_epsilon": 0.05})


def test_replace_one_with_rdp_refused():
    with pytest.raises(PlanRefusedError) as info:
        plan(1000, privacy={"adjacency": "replace_one", "noise_multiplier": 1.0})
    assert "pld" in str(info.value)


def test_epsilon_curve_rdp_every_step():
    p = plan(1000, privacy={"target_epsilon": 3.0}, training={"expected_batch_size": 10, "steps": 300})
    assert [s for s, _ in p.epsilon_curve] == list(range(1, 301))
    check_curve(p)


def test_epsilon_spent():
    """A failed run is charged ε after the steps it accounted: 0.0 at 0 steps, finite, ≤ target."""
    p = plan(1000, privacy={"noise_multiplier": 1.0})
    assert p.epsilon_spent(0) == 0.0
    assert p.epsilon_spent(1) == p.epsilon_curve[0][1] > 0
    assert p.epsilon_spent(p.steps) == p.epsilon <= p.target_epsilon
    with pytest.raises(PlanRefusedError):
        p.epsilon_spent(p.steps + 1)


def test_plan_to_dict_is_json():
    p = plan(1000, privacy={"noise_multiplier": 1.0})
    d = json.loads(json.dumps(p.to_dict()))
    assert d["accountant"] == "rdp" and d["adjacency"] == "add_remove" and d["protected_unit"] == "row"
    assert d["event"]["sample_rate"] == 0.032 and d["event"]["steps"] == 24
    assert math.isclose(d["epsilon"], p.epsilon)


def test_absurd_epochs_are_refused_at_plan_time():
    """T above the supported maximum (10^6) is refused before any accountant work."""
    from dplora.errors import PlanRefusedError

    raw = {
        "privacy": {
            "protected_unit": "row",
            "adjacency": "add_remove",
            "target_epsilon": 8,
            "delta": 1e-7,
            "accountant": "rdp",
            "max_grad_norm": 1.0,
        },
        "model": {"path": "/m"},
        "data": {"path": "d.csv", "text_column": "text"},
        "training": {"expected_batch_size": 1, "epochs": 1000},
    }
    with pytest.raises(PlanRefusedError, match="above the supported"):
        make_plan(parse_contract(raw), num_units=10_000, num_units_source="data")
