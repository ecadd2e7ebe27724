"""The slow tier of tests/accounting/test_attack_ceiling.py, whose docstring describes the module."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from dplora.accounting.ceiling import (
    attack_ceiling,
    ceiling_entry,
    ceiling_sentence,
    same_ceiling,
)
from dplora.accounting.events import DpSgdEvent

F7 = [
    ((0.01, 1.0, 1000), (0.0041, 0.0291, 0.1942)),
    ((32 / 4214, 0.417, 12), (0.0089, 0.0306, 0.1411)),
    ((0.01, 0.616, 1000), (0.0284, 0.1117, 0.3954)),
]


pytestmark = pytest.mark.usefixtures("fresh_cache")  # a calibration cache of each test's own


@pytest.mark.parametrize(("mechanism", "expected"), F7)
def test_f7_rows(mechanism, expected):
    q, sigma, steps = mechanism
    ceiling = attack_ceiling(DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps), use_cache=False)
    assert ceiling.fprs == (0.001, 0.01, 0.1)
    for got, want in zip(ceiling.tprs, expected, strict=True):
        assert got == pytest.approx(want, abs=0.002)
    assert ceiling.interval == 1e-4


def test_gaussian_mechanism_matches_the_closed_form_curve():
    """q = 1, σ 2, T 10: μ = √10/2; the PLD ceiling lies on or just above Φ(Φ⁻¹(α) + μ) (pessimistic, grid)."""
    ceiling = attack_ceiling(DpSgdEvent(sample_rate=1.0, noise_multiplier=2.0, steps=10), use_cache=False)
    mu = math.sqrt(10) / 2
    for alpha, tpr in zip(ceiling.fprs, ceiling.tprs, strict=True):
        exact = NormalDist().cdf(NormalDist().inv_cdf(alpha) + mu)
        assert exact - 1e-6 <= tpr <= exact + 0.002


def test_replace_one_is_weaker_than_add_remove():
    q, sigma, steps = F7[1][0]
    add = attack_ceiling(DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps))
    rep = attack_ceiling(DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps, adjacency="replace_one"))
    assert all(r > a for r, a in zip(rep.tprs, add.tprs, strict=True))


def test_cache_returns_the_computed_value_and_a_damaged_entry_is_recomputed(tmp_path):
    from dplora.accounting import cache

    event = DpSgdEvent(sample_rate=0.05, noise_multiplier=1.2, steps=20)
    first = attack_ceiling(event, use_cache=True)  # the candidate table's path: TPRs kept in the cache
    assert any(key.startswith("ceiling-v1/") for key in cache.load())
    assert attack_ceiling(event, use_cache=True) == first
    for key in cache.load():
        cache.put(key, [2.0, 2.0, 2.0])  # outside [α, 1]: ignored
    assert attack_ceiling(event, use_cache=True) == first
    assert attack_ceiling(event) == first
    assert attack_ceiling(event, use_cache=False) == first


def test_entry_sentence_and_comparison():
    q, sigma, steps = F7[1][0]
    entry = ceiling_entry(DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps))
    assert entry["available"] is True
    assert set(entry["true_positive_rate_at"]) == {"0.1%", "1%", "10%"}
    assert entry["accountant_version"].startswith("dp-accounting ")
    sentence = ceiling_sentence(entry, "one customer's records were used")
    assert "exceed 3.1 % true positives at 1 % false positives" in sentence
    assert "this release alone" in sentence
    assert same_ceiling(entry, entry) is None
    tampered = {**entry, "true_positive_rate_at": {**entry["true_positive_rate_at"], "1%": 0.02}}
    assert "TPR at 1%" in same_ceiling(tampered, entry)
