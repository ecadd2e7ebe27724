"""The one ledger pre-check of planned runs (dplora.ledger.plans.check_plans), for train, budget and sweep alike."""

from __future__ import annotations

import dataclasses

import pytest

from dplora.accounting.events import Accountant, Adjacency
from dplora.contract.choices import ProtectedUnit
from dplora.contract.spec import PrivacySection
from dplora.errors import PlanRefusedError
from dplora.ledger.plans import check_plans
from dplora.ledger.store import Ledger
from dplora.plan.training import TrainingPlan

# q = 0.01, σ = 1, T = 300 under RDP at δ = 1e-5: ε = 1.451 (NOTES.md, "Accountant reference values")
PLAN = TrainingPlan(
    protected_unit=ProtectedUnit.ROW, unit_key=None, adjacency=Adjacency.ADD_REMOVE, num_units=10_000,
    num_units_source="declared", expected_batch_size=100, sample_rate=0.01, steps=300, noise_multiplier=1.0,
    noise_source="given", max_grad_norm=1.0, delta=1e-5, target_epsilon=1.5, accountant=Accountant.RDP,
    accountant_version="test", accountant_note=None, epsilon=1.451, epsilon_curve=((300, 1.451),),
)  # fmt: skip
PRIVACY = PrivacySection(
    protected_unit="row", adjacency="add_remove", target_epsilon=1.5, delta=1e-5, max_grad_norm=1.0, population="p"
)


def _ledger(tmp_path, eps_max: str) -> Ledger:
    ledger = Ledger(tmp_path / "l.sqlite3")
    ledger.set_cap("p", epsilon_max=eps_max, delta_max="1e-4", protected_unit="row", adjacency="add_remove")
    return ledger


def test_one_plan_fits_or_is_refused_with_the_ledgers_own_line(tmp_path):
    ledger = _ledger(tmp_path, "1.5")
    check_plans(ledger, PRIVACY, [PLAN])  # 1.451 <= 1.5
    ledger.reserve(
        population="p", run_id="r1", epsilon="1", delta="1e-5", accountant="rdp", adjacency="add_remove",
        protected_unit="row",
    )  # fmt: skip
    with pytest.raises(PlanRefusedError) as err:
        check_plans(ledger, PRIVACY, [PLAN])
    assert "spent ε=1 + planned ε=1.451 = 2.451 exceeds the cap ε_max=1.5" in str(err.value)
    assert ledger.charges()[0].run_id == "r1" and len(ledger.charges()) == 1  # the check wrote nothing


def test_several_plans_are_summed_exactly_and_composed_by_their_events(tmp_path):
    # basic: 2 × 1.451 = 2.902 > 1.4, but the two events composed (PLD, δ = 2e-5: ε = 1.3590) fit under 1.4
    check_plans(_ledger(tmp_path, "1.4"), PRIVACY, [PLAN, PLAN])
    with pytest.raises(PlanRefusedError) as err:  # three: composed ε = 1.5955 at δ = 3e-5 is over 1.5 as well
        check_plans(_ledger(tmp_path / "b", "1.5"), PRIVACY, [PLAN, PLAN, PLAN])
    assert str(err.value) == (
        "population 'p': spent ε=0 + planned ε=4.353 = 4.353 exceeds the cap ε_max=1.5; composed (PLD) the total "
        "with the planned charge is ε=1.5955 at δ=0.00003, also over the cap"
    )


def test_another_unit_is_refused_before_any_budget(tmp_path):
    other = PrivacySection(
        protected_unit="user", unit_key="user_id", adjacency="add_remove", target_epsilon=1.5, delta=1e-5,
        max_grad_norm=1.0, population="p",
    )  # fmt: skip
    ledger = _ledger(tmp_path, "100")
    with pytest.raises(PlanRefusedError) as err:
        check_plans(ledger, other, [dataclasses.replace(PLAN, protected_unit=ProtectedUnit.USER)])
    assert str(err.value).startswith(
        "population 'p' is capped for protected unit row, adjacency add_remove; this charge is for protected unit "
        "user, adjacency add_remove"
    )
    assert ledger.charges() == []
