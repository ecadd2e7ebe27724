"""The slow tier of tests/accounting/test_accounting_range.py, whose docstring describes the module."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.accounting_range import EVENT, PLD, PRV, RDP, STEPS, assert_checked, fake_pld, never, shared_plan

import dplora.accounting.backends as backends
import dplora.accounting.cost as cost
from dplora.accounting.backends import rdp_epsilons
from dplora.accounting.checked import OutOfRangeError, checked_curve, numerical_chain
from dplora.accounting.cost import (
    MAX_GRID_POINTS,
    Tolerance,
    pld_seconds,
    prv_grid_points,
    tolerance_for,
)
from dplora.accounting.events import Accountant, DpSgdEvent
from dplora.errors import PlanRefusedError

pytestmark = pytest.mark.usefixtures("fresh_cache")  # a calibration cache of each test's own


def test_case2_tiny_target_is_computed_to_its_own_precision():
    """ε=0.01: PRV at eps_error = target/100 would need ~6.9e6 grid points, so PLD (interval 1e-4) decides."""
    p = shared_plan(50_000, 500, 1000, target_epsilon=0.01, delta=1e-5, accountant="prv")
    assert p.noise_multiplier == pytest.approx(81.4, rel=0.05)  # not 757.8 (PRV at its fixed eps_error 0.01)
    assert p.accountant is PLD and "PRV not used" in p.accountant_note and "grid points" in p.accountant_note
    assert_checked(p)
    assert p.epsilon_at(1) < 0.001


def test_case3_huge_target_is_decided_by_the_cost_estimate(monkeypatch):
    """ε=1e6 on the demo's q and T: PRV and PLD would need billions of points; RDP is used, neither is called."""
    monkeypatch.setattr(backends, "prv_epsilon", never)
    monkeypatch.setattr(backends, "pld_epsilons", never)
    p = shared_plan(1000, 32, 24, target_epsilon=1e6, accountant="prv")
    assert p.accountant is RDP
    assert "PRV would need" in p.accountant_note and "PLD would take" in p.accountant_note
    assert_checked(p)
    event = DpSgdEvent(sample_rate=0.032, noise_multiplier=p.noise_multiplier, steps=24)
    assert prv_grid_points(event, 1e-5, 0.01) > 100 * MAX_GRID_POINTS
    assert pld_seconds(event, 1e-4) > 100 * cost.PLD_MAX_SECONDS


def test_demo_contract_keeps_prv():
    """The demo's σ (0.514, calibrated with PRV) passes every check: PRV's own numbers, no note."""
    p = shared_plan(1000, 32, 24, accountant="prv", noise_multiplier=0.5143)
    assert p.accountant is PRV and p.accountant_note is None
    assert p.epsilon == pytest.approx(7.945, abs=0.01)
    assert_checked(p)


def test_prv_failing_falls_to_pld_then_rdp(monkeypatch):
    def broken(*_args):
        raise backends.AccountingNumericalError("Discrete mean differs from continuous mean")

    monkeypatch.setattr(backends, "prv_epsilon", broken)
    curve = checked_curve(EVENT, 1e-5, (PRV, PLD), STEPS, Tolerance())
    assert curve.accountant is PLD and "Discrete mean" in curve.notes[0]
    monkeypatch.setattr(backends, "pld_epsilons", fake_pld(lambda s, t: math.nan))
    curve = checked_curve(EVENT, 1e-5, (PRV, PLD), STEPS, Tolerance())
    assert curve.accountant is RDP and len(curve.notes) == 2


@pytest.mark.parametrize("privacy", [{"target_epsilon": 1.0}, {"target_epsilon": 8.0, "noise_multiplier": 5.0}])
def test_epsilon_rising_with_sigma_is_caught(monkeypatch, privacy):
    """Calibration checks its (σ, ε) pairs; a given σ is probed at 1.01·σ. Either way the plan uses RDP."""
    monkeypatch.setattr(backends, "pld_epsilons", fake_pld(lambda s, t: s * s / 10 * t / 100))
    p = shared_plan(10_000, 100, 100, accountant="pld", **privacy)
    assert p.accountant is RDP and "not non-increasing in σ" in p.accountant_note
    assert_checked(p)


@pytest.mark.parametrize(
    ("q", "sigma", "steps", "delta", "eps_error"),
    [
        (0.01, 1.0, 300, 1e-5, 0.01),
        (0.2, 0.72, 20, 1e-3, 0.01),
        (0.01, 81.4, 1000, 1e-5, 1e-3),
        (1.0, 1.0, 10, 1e-5, 0.01),
    ],
)
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")  # Opacus's own, called directly
def test_prv_estimate_is_opacus_domain_and_value(q, sigma, steps, delta, eps_error):
    """The estimate is the domain Opacus's PRVAccountant allocates, and dplora's PRV value is Opacus's, bit for bit."""
    from opacus.accountants import PRVAccountant
    from opacus.accountants.analysis.prv import PoissonSubsampledGaussianPRV

    acc = PRVAccountant()
    domain = acc._get_domain(
        prvs=[PoissonSubsampledGaussianPRV(q, sigma)],
        num_self_compositions=[steps],
        eps_error=eps_error,
        delta_error=delta / 1000,
    )
    event = DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps)
    assert prv_grid_points(event, delta, eps_error) == domain.size
    acc.history = [(sigma, q, steps)]
    assert backends.prv_epsilon(event, delta, eps_error) == acc.get_epsilon(delta=delta, eps_error=eps_error)


HYPO = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture]}


@settings(max_examples=15, **HYPO)
@given(
    q=st.floats(1e-4, 1.0),
    log_sigma=st.floats(-1.0, 2.0),
    steps=st.integers(1, 3000),
    log_delta=st.floats(-18.0, -2.0),
    log_target=st.floats(-3.0, 4.0),
    accountant=st.sampled_from(["prv", "pld"]),
    adjacency=st.sampled_from(["add_remove", "add_remove", "replace_one"]),
)
def test_property_checked_curves(monkeypatch, q, log_sigma, steps, log_delta, log_target, accountant, adjacency):
    """No checked curve is non-finite or decreasing in T, and under add/remove none is above RDP.

    The limits are lowered to 2^17 work units (PRV) and 0.08 s (PLD) to keep each example under a second; the
    property holds at any limit (a smaller one only sends more draws to RDP or refusal).
    """
    monkeypatch.setattr(cost, "MAX_GRID_POINTS", 2**17)
    monkeypatch.setattr(cost, "PLD_MAX_SECONDS", 0.08)
    if adjacency == "replace_one":
        accountant = "pld"
    event = DpSgdEvent(sample_rate=q, noise_multiplier=10**log_sigma, steps=steps, adjacency=adjacency)
    delta = 10**log_delta
    points = sorted({1, max(1, steps // 3), max(1, 2 * steps // 3), steps})
    chain = numerical_chain(Accountant(accountant), event.adjacency)
    try:
        curve = checked_curve(event, delta, chain, points, tolerance_for(10**log_target), probe_sigma=True)
    except OutOfRangeError:
        assert adjacency == "replace_one"
        return
    assert all(math.isfinite(v) and v >= 0 for v in curve.epsilons)
    assert all(a <= b for a, b in zip(curve.epsilons, curve.epsilons[1:], strict=False))
    if adjacency == "add_remove":
        rdp = rdp_epsilons(event, delta, points)
        assert all(v <= r for v, r in zip(curve.epsilons, rdp, strict=True))


@settings(max_examples=5, **HYPO)
@given(
    n=st.integers(200, 100_000),
    batch_frac=st.floats(0.001, 0.05),
    steps=st.integers(1, 2000),
    log_delta=st.floats(-18.0, -6.0),
    log_target=st.floats(-0.3, 4.0),
    accountant=st.sampled_from(["prv", "pld", "rdp"]),
)
def test_property_calibrated_plans(monkeypatch, n, batch_frac, steps, log_delta, log_target, accountant):
    """A calibrated plan meets its target (ε up to 1e4, δ down to 1e-18) with a checked curve, or is refused."""
    monkeypatch.setattr(cost, "MAX_GRID_POINTS", 2**15)
    monkeypatch.setattr(cost, "PLD_MAX_SECONDS", 0.02)
    batch = max(1, int(n * batch_frac))
    try:
        p = shared_plan(n, batch, steps, target_epsilon=10**log_target, delta=10**log_delta, accountant=accountant)
    except PlanRefusedError:
        return
    assert_checked(p)
