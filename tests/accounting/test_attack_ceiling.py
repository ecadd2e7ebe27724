"""The attack ceiling (issue 46 item 1): F7's three rows, a closed-form reference, and what the ceiling may read.

References: ../shared/cases/README.md F7 (dp_accounting ``get_true_positive_rates``, PLD add/remove, ε grid 0-30
step 0.01, tolerance ±0.002) and, at q = 1, the Gaussian trade-off curve TPR(α) = Φ(Φ⁻¹(α) + μ) with
μ = √T/σ (Dong, Roth & Su 2022, μ-GDP is exact for T Gaussian mechanisms of sensitivity 1 and std σ).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplora.accounting.ceiling import (
    EPS_GRID,
    attack_ceiling,
    ceiling_entry,
    ceiling_sentence,
    profile_deltas,
    tradeoff_tpr,
)
from dplora.accounting.events import DpSgdEvent

pytestmark = pytest.mark.usefixtures("fresh_cache")  # a calibration cache of each test's own


def test_the_single_pair_bound_is_vacuous_where_the_ceiling_is_not():
    """F7 row 3: ε 6.842 at δ 1e-5 gives e^ε·α + δ > 1 at α = 1 %, yet the ceiling is 0.11."""
    assert math.exp(6.842) * 0.01 + 1e-5 > 1.0
    ceiling = attack_ceiling(DpSgdEvent(sample_rate=0.01, noise_multiplier=0.616, steps=1000))
    assert ceiling.at(0.01) < 0.12


def test_tradeoff_formula_on_a_pure_dp_profile():
    """A pure 1-DP profile (δ = 0 from ε = 1, vacuous below): TPR(α) = min(e·α, 1 - (1-α)/e) (Kairouz et al.)."""
    eps = np.arange(3001) / 100.0
    deltas = np.where(eps >= 1.0, 0.0, 1.0)
    for alpha in (0.001, 0.01, 0.1, 0.5):
        want = min(math.e * alpha, 1 - (1 - alpha) / math.e)
        assert tradeoff_tpr(deltas, eps, alpha) == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError):
        tradeoff_tpr(deltas, eps[:-1], 0.01)


def test_edge_mechanisms():
    """No steps: a test cannot beat chance (TPR = α); no noise: nothing bounds it (1)."""
    assert attack_ceiling(DpSgdEvent(sample_rate=0.1, noise_multiplier=1.0, steps=0)).tprs == (0.001, 0.01, 0.1)
    assert attack_ceiling(DpSgdEvent(sample_rate=0.1, noise_multiplier=0.0, steps=5)).tprs == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        attack_ceiling(DpSgdEvent(sample_rate=0.1, noise_multiplier=1.0, steps=5), fprs=(0.0,))


def test_a_numerical_failure_is_stated_not_raised(monkeypatch):
    import dplora.accounting.ceiling as ceiling

    def boom(*args, **kwargs):
        raise FloatingPointError("overflow")

    monkeypatch.setattr(ceiling, "_profile", boom)
    ceiling.computed.cache_clear()
    entry = ceiling_entry(DpSgdEvent(sample_rate=0.2, noise_multiplier=0.9, steps=7), use_cache=False)
    assert entry["available"] is False and "FloatingPointError" in entry["reason"]
    assert "not stated" in ceiling_sentence(entry)


def test_q1_is_the_exact_gaussian_curve_at_any_t_without_a_pld(monkeypatch):
    """q = 1, σ 1000, T 10^6 (μ = √10^6/1000 = 1): the PLD took 53-71 s here (5.26e6 composed points) though the
    accountant's cost model predicted 0.76 s; the closed form Φ(Φ⁻¹(α) + μ) is exact and never builds a PLD."""
    from scipy.stats import norm

    import dplora.accounting.ceiling as ceiling_mod
    from dplora.accounting.ceiling import GAUSSIAN_METHOD, ceiling_entry

    def no_pld(*args):
        raise AssertionError("the PLD was built at q = 1")

    monkeypatch.setattr(ceiling_mod, "_profile", no_pld)
    monkeypatch.setattr(ceiling_mod, "_one_step", no_pld)
    entry = ceiling_entry(DpSgdEvent(sample_rate=1.0, noise_multiplier=1000.0, steps=10**6), use_cache=False)
    assert entry["available"] and entry["method"] == GAUSSIAN_METHOD and entry["pld_interval"] == 0.0
    for key, alpha in (("0.1%", 0.001), ("1%", 0.01), ("10%", 0.1)):
        assert entry["true_positive_rate_at"][key] == pytest.approx(norm.cdf(norm.ppf(alpha) + 1.0), abs=1e-6)
    # replace-one: sensitivity 2C, μ = 2
    replace = ceiling_entry(
        DpSgdEvent(sample_rate=1.0, noise_multiplier=1000.0, steps=10**6, adjacency="replace_one"), use_cache=False
    )
    assert replace["true_positive_rate_at"]["1%"] == pytest.approx(norm.cdf(norm.ppf(0.01) + 2.0), abs=1e-6)


def test_huge_t_plans_take_a_coarser_interval_or_are_not_stated():
    """q 0.5, σ 20, T 10^5 at interval 1e-4 is 46 s here (the accountant's model said 1.2 s): the ceiling's own
    cost counts dp_accounting's exact composed size (its Chernoff bounds), so the interval is 1e-3; at T 10^7 no
    interval fits and the ceiling is not stated, with a one-line reason, never computed past the limit."""
    from dplora.accounting.ceiling import ceiling_entry, ceiling_interval, ceiling_seconds
    from dplora.accounting.cost import PLD_MAX_SECONDS

    big = DpSgdEvent(sample_rate=0.5, noise_multiplier=20.0, steps=10**5)
    assert ceiling_seconds(big, 1e-4) > PLD_MAX_SECONDS >= ceiling_seconds(big, 1e-3)
    assert ceiling_interval(big) == 1e-3
    huge = DpSgdEvent(sample_rate=0.5, noise_multiplier=20.0, steps=10**7)
    assert ceiling_interval(huge) is None
    entry = ceiling_entry(huge, use_cache=False)
    assert not entry["available"] and "time limit" in entry["reason"] and "\n" not in entry["reason"]


def test_the_demo_keeps_its_finest_interval():
    """The cost check must not coarsen ordinary plans: F7 row 2 (the demo) stays at 1e-4."""
    from dplora.accounting.ceiling import ceiling_interval

    assert ceiling_interval(DpSgdEvent(sample_rate=32 / 4214, noise_multiplier=0.417, steps=12)) == 1e-4


@pytest.mark.parametrize(
    ("q", "sigma", "steps", "relation", "interval"),
    [
        (0.032, 0.5143, 24, "add_remove", 1e-4),  # the demo's mechanism, at the record's interval
        (0.3, 2.0, 40, "replace_one", 1e-4),
        (0.01, 1.1, 1000, "add_remove", 1e-3),
        (0.001, 0.8, 5000, "replace_one", 1e-2),
        (0.2, 0.6, 1, "add_remove", 1e-4),  # one step: the uncomposed pmf
    ],
)
def test_profile_deltas_is_dp_accountings_delta_bit_for_bit(q, sigma, steps, relation, interval):
    """Recorded ceilings were computed with dp_accounting's own δ(ε) loop: the array version must give the same
    floats, or `verify` of an older record could round a TPR differently."""
    import dp_accounting
    from dp_accounting.pld import privacy_loss_distribution

    rel = {
        "add_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        "replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE,
    }[relation]
    with np.errstate(all="ignore"):
        one = privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=sigma, value_discretization_interval=interval, sampling_prob=q, neighboring_relation=rel
        )
        pld = one.self_compose(steps) if steps > 1 else one
        want = np.asarray(pld.get_delta_for_epsilon(EPS_GRID), dtype=float)
        got = profile_deltas(pld, EPS_GRID)
    assert want.shape == got.shape == EPS_GRID.shape
    assert np.array_equal(got, want)
    assert 0.0 < want[0] <= 1.0 and want[-1] < want[0]  # a real profile, not an all-zero one


def test_profile_deltas_refuses_an_unsorted_grid():
    import dp_accounting
    from dp_accounting.pld import privacy_loss_distribution

    pld = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=1.0,
        value_discretization_interval=1e-2,
        sampling_prob=0.1,
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    )
    with pytest.raises(ValueError, match="ascending"):
        profile_deltas(pld, np.array([1.0, 0.5]))
