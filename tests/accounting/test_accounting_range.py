"""Accountants only where their numbers hold (issue 7): the cost and δ range of PRV/PLD decided before any call,
checked ε curves with RDP as the floor under add/remove, tolerance from the target, and refusal under replace-one.

Cases 1-3 are the issue's: a tiny δ (N=120, q=1/15, T=400, δ=1e-15, ε=4), a tiny ε (N=50,000, q=0.01, T=1000,
δ=1e-5, ε=0.01) and a huge ε (the demo contract, ε=1e6). Reference σ values: RDP reaches ε=4.00 in case 1 at
σ ≈ 2.955 (ε 2.09 / 2.87 / 3.48 / 4.00 at 25 / 50 / 75 / 100 % of T); PLD at its default interval (1e-4 =
target/100) needs σ ≈ 81.4 in case 2.
"""

from __future__ import annotations

import math

import pytest
from support.accounting_range import EVENT, PLD, RDP, STEPS, assert_checked, fake_pld, never, shared_plan

import dplora.accounting.backends as backends
import dplora.accounting.cost as cost
from dplora.accounting.backends import rdp_epsilons
from dplora.accounting.checked import OutOfRangeError, checked_curve
from dplora.accounting.cost import (
    Tolerance,
    pld_seconds,
    pld_step_range,
    tolerance_for,
)
from dplora.accounting.events import DpSgdEvent

pytestmark = pytest.mark.usefixtures("fresh_cache")  # a calibration cache of each test's own


def test_case1_tiny_delta_is_rdp_without_calling_prv_or_pld(monkeypatch):
    """δ=1e-15: below PRV's floating point and PLD's truncated mass, so neither is called; RDP decides."""
    monkeypatch.setattr(backends, "prv_epsilon", never)
    monkeypatch.setattr(backends, "pld_epsilons", never)
    p = shared_plan(120, 8, 400, target_epsilon=4.0, delta=1e-15, accountant="prv")
    assert p.noise_multiplier <= 2.955 * 1.001
    assert p.accountant is RDP and p.accountant_version.startswith("opacus ")
    assert "PRV not used" in p.accountant_note and "PLD not used" in p.accountant_note
    assert "δ=1e-15" in p.accountant_note
    assert_checked(p)
    quarters = [p.epsilon_at(t) for t in (100, 200, 300, 400)]
    assert quarters == pytest.approx([2.09, 2.87, 3.48, 4.00], abs=0.01)
    assert p.epsilon_spent(0) == 0.0 and math.isfinite(p.epsilon_spent(1))


@pytest.mark.parametrize(
    ("privacy", "fragment"),
    [
        ({"delta": 1e-15}, "privacy.delta"),  # PLD's truncated mass is 1e-15
        ({"noise_multiplier": 0.01, "target_epsilon": 1e6}, "training.steps"),  # PLD's cost
    ],
)
def test_replace_one_outside_pld_range_is_refused(privacy, fragment):
    with pytest.raises(OutOfRangeError) as info:
        shared_plan(1000, 32, 24, adjacency="replace_one", accountant="pld", **privacy)
    assert info.value.exit_code == 2 and fragment in str(info.value) and "PLD" in str(info.value)


def test_decreasing_curve_falls_to_rdp(monkeypatch):
    monkeypatch.setattr(backends, "pld_epsilons", fake_pld(lambda s, t: 1.0 - t / 200))
    curve = checked_curve(EVENT, 1e-5, (PLD,), STEPS, Tolerance())
    assert curve.accountant is RDP and "not non-decreasing in T" in curve.notes[0]
    assert curve.epsilons == tuple(rdp_epsilons(EVENT, 1e-5, STEPS))


def test_infinite_value_falls_to_rdp(monkeypatch):
    monkeypatch.setattr(backends, "pld_epsilons", fake_pld(lambda s, t: math.inf))
    curve = checked_curve(EVENT, 1e-5, (PLD,), STEPS, Tolerance())
    assert curve.accountant is RDP and "inf" in curve.notes[0]


def test_answer_above_rdp_is_floored(monkeypatch):
    monkeypatch.setattr(backends, "pld_epsilons", fake_pld(lambda s, t: 100.0))
    curve = checked_curve(EVENT, 1e-5, (PLD,), STEPS, Tolerance())
    assert curve.accountant is PLD and "lower at 3 of 3 points" in curve.notes[0]
    assert curve.epsilons == tuple(rdp_epsilons(EVENT, 1e-5, STEPS))


def test_wobble_within_the_slack_is_smoothed_to_a_bound(monkeypatch):
    """A decrease within 2·eps_error is kept as the later (valid, lower) bound: a suffix minimum."""
    monkeypatch.setattr(backends, "pld_epsilons", fake_pld(lambda s, t: {1: 0.05, 50: 0.30, 100: 0.29}[t]))
    curve = checked_curve(EVENT, 1e-5, (PLD,), STEPS, Tolerance())
    assert curve.accountant is PLD and curve.epsilons == (0.05, 0.29, 0.29)


def test_replace_one_failing_check_is_refused(monkeypatch):
    monkeypatch.setattr(backends, "pld_epsilons", fake_pld(lambda s, t: math.inf))
    event = DpSgdEvent(sample_rate=0.01, noise_multiplier=1.0, steps=100, adjacency="replace_one")
    with pytest.raises(OutOfRangeError, match="replace_one needs PLD"):
        checked_curve(event, 1e-5, (PLD,), STEPS, Tolerance())


def test_tolerance_follows_the_target():
    assert tolerance_for(8.0) == Tolerance(eps_error=0.01, pld_interval=1e-4)
    assert tolerance_for(0.01) == Tolerance(eps_error=1e-4, pld_interval=1e-4)
    assert tolerance_for(1e-3) == Tolerance(eps_error=1e-5, pld_interval=1e-5)


@pytest.mark.parametrize(
    ("q", "sigma", "steps", "adjacency"),
    [
        (1 / 15, 2.955, 400, "add_remove"),
        (0.01, 2.0, 1000, "add_remove"),
        (1.0, 5.0, 10, "add_remove"),
        (0.01, 2.0, 100, "replace_one"),
    ],
)
def test_pld_estimate_covers_dp_accounting(q, sigma, steps, adjacency):
    """One-step points match dp_accounting's pmfs within 1 %; the composed estimate is never below its size.

    Reads dp_accounting's private pmf fields (sizes only), pinned to dp-accounting 0.6.0.
    """
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution

    relation = {
        "add_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        "replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE,
    }[adjacency]
    one = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=sigma, value_discretization_interval=1e-4, sampling_prob=q, neighboring_relation=relation
    )
    composed = one.self_compose(steps)
    pmfs = [one._pmf_remove] + ([one._pmf_add] if one._pmf_add is not one._pmf_remove else [])
    event = DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps, adjacency=adjacency)
    width = pld_step_range(event)
    assert sum(p.size for p in pmfs) == pytest.approx(len(pmfs) * width / 1e-4, rel=0.01)
    composed_points = composed._pmf_remove.size + (composed._pmf_add.size if len(pmfs) == 2 else 0)
    step = cost.PLD_REPLACE_STEP_POINT_SECONDS if adjacency == "replace_one" else cost.PLD_STEP_POINT_SECONDS
    estimate = pld_seconds(event, 1e-4) - step * len(pmfs) * width / 1e-4
    assert estimate / cost.PLD_COMPOSED_POINT_SECONDS >= composed_points
    # dplora's PLD value is the PLDAccountant's (which also composes with an identity PLD: rounding only)
    acc = pld_privacy_accountant.PLDAccountant(neighboring_relation=relation)
    acc.compose(event.to_dp_accounting())
    if backends.has_exact_route(event, steps):  # q = 1: the analytic Gaussian, which PLD's grid bounds from above
        assert backends.pld_epsilon(event, 1e-5) <= acc.get_epsilon(1e-5) <= backends.pld_epsilon(event, 1e-5) + 0.01
    else:
        assert backends.pld_epsilon(event, 1e-5) == pytest.approx(acc.get_epsilon(1e-5), abs=1e-9)
