"""A test-only accountant, defined and registered here and nowhere else, runs the same contract (issue 44, item 3).

The Gaussian mechanism without subsampling (q = 1) composed T times is one Gaussian mechanism with σ/√T
(sensitivity 1 under add/remove, 2 under replace-one), and its ε(δ) has a closed form: δ(ε) = Φ(1/(2s) − εs)
− e^ε Φ(−1/(2s) − εs) at s = σ/(Δ√T) (Balle & Wang 2018, Thm. 8). Solved here with scipy alone, it must match the
pinned q = 1 values of ``test_accounting_exact.py`` and dp_accounting's own PLD grid at q = 1.
"""

from __future__ import annotations

import math

import pytest
from accountant_contract import AccountantContract

from dplora.accounting import backends, registry
from dplora.accounting.events import Adjacency, DpSgdEvent


@registry.register
class GaussianQ1Accountant(registry.PrivacyAccountant):
    """Closed-form ε of T unsubsampled Gaussian mechanisms (q = 1 only), both relations."""

    name = "gaussian_q1_test"
    package = "scipy"
    relations = frozenset({Adjacency.ADD_REMOVE, Adjacency.REPLACE_ONE})

    def supports(self, event) -> bool:
        return super().supports(event) and event.sample_rate == 1.0

    def epsilons(self, event, delta, steps, tolerance=None):
        return [0.0 if t == 0 else analytic_gaussian_epsilon(self._scale(event, t), delta) for t in steps]

    def _scale(self, event: DpSgdEvent, steps: int) -> float:
        sensitivity = 2.0 if self.adjacency is Adjacency.REPLACE_ONE else 1.0
        return event.noise_multiplier / (sensitivity * math.sqrt(steps))


def analytic_gaussian_epsilon(s: float, delta: float) -> float:
    """The smallest ε with δ(ε) ≤ δ for the Gaussian mechanism of noise s per unit sensitivity (Balle & Wang)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def excess(eps: float) -> float:
        return float(norm.cdf(0.5 / s - eps * s) - math.exp(eps + norm.logcdf(-0.5 / s - eps * s))) - delta

    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2.0
    return float(brentq(excess, 0.0, hi, xtol=1e-12, rtol=1e-12))


class TestGaussianQ1(AccountantContract):
    name = "gaussian_q1_test"
    references = (
        (1.0, 1.0, 10, 1e-5, "add_remove", 17.857, 0.02),  # A7, q = 1 (PLD 17.857, RDP 19.05)
        (1.0, 1.0, 10, 1e-5, "replace_one", 46.211, 0.02),  # A7 under replace-one: σ_eff = σ/(2√T)
        (1.0, 0.3, 1, 1e-5, "add_remove", 19.131, 0.02),  # one Gaussian mechanism, σ = 0.3
    )
    monotone = (1.0, 10.0, (1, 10, 100))
    unsupported = (DpSgdEvent(sample_rate=0.5, noise_multiplier=1.0, steps=10),)  # subsampled: not this one

    @pytest.mark.parametrize(("sigma", "steps", "adjacency"), [(1.0, 10, "add_remove"), (2.0, 4, "replace_one")])
    def test_matches_dp_accounting_at_q_1(self, sigma, steps, adjacency):
        """Equal to dp_accounting's analytic Gaussian (1e-6), and below its pessimistic PLD grid by ≤ 0.02."""
        import dp_accounting
        from dp_accounting.pld import privacy_loss_distribution

        e = DpSgdEvent(sample_rate=1.0, noise_multiplier=sigma, steps=steps, adjacency=adjacency)
        ours = backends.epsilons(e, 1e-5, self.name, [steps])[0]
        scale = 2.0 if adjacency == "replace_one" else 1.0
        assert ours == pytest.approx(dp_accounting.get_epsilon_gaussian(sigma / (scale * math.sqrt(steps)), 1e-5))
        relation = {
            "add_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
            "replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE,
        }[adjacency]
        grid = privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=sigma, value_discretization_interval=1e-3, neighboring_relation=relation
        )
        composed = grid.self_compose(steps).get_epsilon_for_delta(1e-5)
        assert ours <= composed <= ours + 0.02


def test_registered_here_is_found_by_name():
    assert registry.get("gaussian_q1_test") is GaussianQ1Accountant
    assert registry.key("gaussian_q1_test") == "gaussian_q1_test"  # not a contract accountant: a plain name


def test_public_api_and_calibration_take_a_registered_name():
    """``epsilon`` and ``calibrate_noise`` accept the registered name: σ meets the target, 1 % less does not, and
    the checked ε (floored by RDP) never needs more noise than RDP alone."""
    from dplora.accounting import calibrate_noise, epsilon

    def eps(sigma: float, accountant: str = "gaussian_q1_test") -> float:
        return epsilon(sample_rate=1.0, noise_multiplier=sigma, steps=10, delta=1e-5, accountant=accountant)

    assert eps(1.0) == pytest.approx(17.857, abs=0.02)
    sigma = calibrate_noise(target_epsilon=2.0, sample_rate=1.0, steps=10, delta=1e-5, accountant="gaussian_q1_test")
    assert eps(sigma) <= 2.0 < eps(sigma / 1.01)
    assert sigma <= calibrate_noise(target_epsilon=2.0, sample_rate=1.0, steps=10, delta=1e-5, accountant="rdp")
