"""The slow tier of tests/plan/test_frontier.py, whose docstring describes the module."""

from __future__ import annotations

import math

import pytest

# PLD, add/remove, δ 1e-5, ε 8 (N, B, E, T): the noise–compute frontier the planner must reach
FRONTIER = [(1600, 32, 3, 150), (1600, 256, 10, 63), (1600, 512, 10, 32), (1600, 800, 20, 40), (554, 32, 10, 174),
            (554, 554, 20, 20), (554, 277, 50, 100)]  # fmt: skip


def _dp_accounting_sigma(q: float, steps: int) -> float:
    """The tight σ for ε 8 at δ 1e-5 from dp_accounting's own PLD calibration (its default discretisation)."""
    import dp_accounting

    def event(sigma: float):
        one = dp_accounting.GaussianDpEvent(sigma)
        return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, one) if q < 1 else one, steps)

    return dp_accounting.calibrate_dp_mechanism(
        dp_accounting.pld.PLDAccountant, event, target_epsilon=8.0, target_delta=1e-5, tol=1e-5
    )


@pytest.mark.parametrize(("n", "b", "e", "t"), FRONTIER, ids=[f"N{r[0]}-B{r[1]}-E{r[2]}" for r in FRONTIER])
def test_frontier_sigma_is_never_below_dp_accountings_and_within_one_percent(n, b, e, t):
    from dplora.accounting.calibration import calibrate

    assert math.ceil(e * n / b) == t
    sigma, eps = calibrate(
        target_epsilon=8.0, sample_rate=b / n, steps=t, delta=1e-5, accountant="pld", adjacency="add_remove"
    )
    reference = _dp_accounting_sigma(b / n, t)
    assert eps <= 8.0
    assert reference <= sigma <= 1.01 * reference, (sigma, reference)
