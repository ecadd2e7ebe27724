"""Attacks on the ceiling entry and the composed ceiling (dplora.accounting.ceiling, ceiling_compose): no stated
ceiling may fall below the exact curve, through rounding, a noiseless event or a tiny positive noise.

Each ``test_finding_*`` holds a fix; ``test_held_*`` and ``test_holds_*`` pin attempts that held. The reference is
independent of dplora's PLD code: at q = 1 the T-step mechanism is exactly μ-GDP with μ = s·√T/σ, its trade-off
curve TPR(α) = Φ(Φ⁻¹(α) + μ) (Dong, Roth & Su 2022, Def. 2.4), which no ceiling may state below; a mechanism with no
noise lets a test reach TPR 1.
"""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm
from support.ceiling_attacks import TINY, gaussian_tpr

from dplora.accounting.ceiling import ceiling_entry, ceiling_sentence, percent_up
from dplora.accounting.ceiling_compose import composed_ceiling
from dplora.accounting.events import DpSgdEvent

FPRS = {"0.1%": 0.001, "1%": 0.01, "10%": 0.1}


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_finding_noiseless_count_charge_vanishes_from_the_composed_ceiling(mechanism):
    """Guarantees 1 and 4. ``composed_ceiling`` reads ``PLDAccountant._pld`` directly, but dp_accounting composes a
    noise-0 Gaussian/Laplace event by setting ``_contains_non_dp_event`` and leaving ``_pld`` untouched; the
    ledger accepts such an event (``validate_events``: noise_multiplier >= 0). Input: one ``gaussian`` (or
    ``laplace``) event with noise_multiplier 0 (a count released without noise). Expected: TPR 1 (or not stated);
    observed: TPR = α at every FPR, 'no test beats guessing'."""
    entry = composed_ceiling([{"mechanism": mechanism, "noise_multiplier": 0.0}], "add_remove")
    assert not entry["available"] or all(v == 1.0 for v in entry["true_positive_rate_at"].values()), entry


SIGMA_JUST_ABOVE_3 = 2.244373  # q = 1, T = 1: exact TPR at 1 % FPR = 0.0300003042 (3.00003 %)


def test_finding_record_ceiling_is_rounded_below_the_exact_gaussian_curve():
    """Guarantee 1 (rounding in JSON and card). ``AttackCeiling.to_dict`` stores ``round(t, 6)`` (nearest, not
    up), and the card/verify/budget sentence rounds UP that already-rounded value. Input: q = 1, σ = 2.244373,
    T = 1, add/remove (exact μ-GDP, μ = 1/σ). Exact TPR at 1 % = 0.03000030: the record states 0.03 and the
    sentence 'can exceed 3.0 %', below the exact curve (should be ≥ 0.0300003 and '3.1 %')."""
    event = DpSgdEvent(sample_rate=1.0, noise_multiplier=SIGMA_JUST_ABOVE_3, steps=1)
    entry = ceiling_entry(event, use_cache=False)
    mu = 1.0 / SIGMA_JUST_ABOVE_3
    for key, alpha in FPRS.items():
        assert entry["true_positive_rate_at"][key] >= gaussian_tpr(mu, alpha), key
    assert f"exceed {percent_up(gaussian_tpr(mu, 0.01))} %" in ceiling_sentence(entry)  # '3.1 %', says '3.0 %'


@pytest.mark.parametrize(("sigma", "steps"), [(0.05, 1), (1e3, 10**9), (1.0, 10**6)])
def test_held_q1_extreme_sigma_and_steps_stay_above_the_exact_curve(sigma, steps):
    """q = 1 at tiny σ and huge T goes through the closed form: never below Φ(Φ⁻¹(α) + √T/σ) (up to 6-decimal
    rounding, the finding above)."""
    entry = ceiling_entry(DpSgdEvent(sample_rate=1.0, noise_multiplier=sigma, steps=steps), use_cache=False)
    mu = math.sqrt(steps) / sigma
    for key, alpha in FPRS.items():
        assert entry["true_positive_rate_at"][key] >= gaussian_tpr(mu, alpha) - 5e-7


@pytest.mark.parametrize("event", TINY, ids=["gaussian", "dp_sgd"])
def test_finding_composed_ceiling_raises_on_tiny_positive_noise(event):
    """Same input at the function: ``composed_ceiling([event], 'add_remove')``. Expected: TPR 1.0 at every FPR
    (μ = 1e300: a test reaches TPR 1) or available False with a reason. Observed: OverflowError."""
    entry = composed_ceiling([event], "add_remove")
    assert not entry["available"] or all(v == 1.0 for v in entry["true_positive_rate_at"].values())


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("adjacency", ["add_remove", "replace_one"])
def test_holds_gaussian_count_ceiling_not_below_exact_curve(sigma, adjacency):
    """Attempt that held: one gaussian count event (noise_multiplier = std / sensitivity under the adjacency) is
    μ = 1/σ GDP; the composed ceiling is never below Φ(Φ⁻¹(α) + 1/σ)."""
    entry = composed_ceiling([{"mechanism": "gaussian", "noise_multiplier": sigma}], adjacency)
    for key, alpha in {"0.1%": 0.001, "1%": 0.01, "10%": 0.1}.items():
        assert entry["true_positive_rate_at"][key] >= norm.cdf(norm.ppf(alpha) + 1 / sigma)


@pytest.mark.parametrize("sigma", [-1.0, -0.0])
def test_holds_negative_noise_gives_tpr_one(sigma):
    """Attempt that held: a negative or -0.0 noise multiplier gives TPR 1 at every FPR."""
    entry = composed_ceiling([{"mechanism": "gaussian", "noise_multiplier": sigma}], "replace_one")
    assert all(v == 1.0 for v in entry["true_positive_rate_at"].values())
