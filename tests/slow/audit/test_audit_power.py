"""The slow tier of tests/audit/test_audit_power.py, whose docstring describes the module."""

from __future__ import annotations

import math

import pytest

from dplora.accounting.events import DpSgdEvent
from dplora.audit import power

pytestmark = pytest.mark.usefixtures("fresh_cache")  # a calibration cache of each test's own


@pytest.mark.parametrize(("m", "r", "eps0", "eps5"), [(1000, 100, 3.4930, 3.4654), (1000, 1000, 5.8091, 5.7823)])
def test_f9_ceiling_of_a_canary_count(m, r, eps0, eps5):
    assert power.bound_ceiling(m=m, r=r, delta=0.0) == pytest.approx(eps0, abs=1e-4)
    q = 0.05 ** (1 / r)
    assert power.bound_ceiling(m=m, r=r, delta=0.0) == pytest.approx(math.log(q / (1 - q)), abs=1e-4)
    assert power.bound_ceiling(m=m, r=r, delta=1e-5) == pytest.approx(eps5, abs=1e-4)


def test_uninformative_below_1000_canaries_and_when_the_ceiling_is_below_the_claim():
    small = power.informativeness(m=100, r=50, delta=1e-5, claimed_epsilon=1.0)
    assert not small["informative"] and "100 canaries, fewer than 1000" in small["reasons"][0]
    blind = power.informativeness(m=1000, r=1000, delta=0.0, claimed_epsilon=8.0)  # F9: at most 5.81
    assert not blind["informative"] and "at most ε̂ = 5.8091" in blind["reasons"][0]
    fine = power.informativeness(m=1000, r=500, delta=1e-5, claimed_epsilon=1.0)
    assert fine["informative"] and fine["reasons"] == []
    assert power.verdict(bound_violation=False, ceiling_exceeded=False, informative=False) == "uninformative"
    assert power.verdict(bound_violation=True, ceiling_exceeded=False, informative=False) == "violation"
    assert power.verdict(bound_violation=False, ceiling_exceeded=True, informative=True) == "violation"
    assert power.verdict(bound_violation=False, ceiling_exceeded=False, informative=True) == "no violation detected"


def test_perfect_separation_on_many_canaries_exceeds_a_tight_ceiling():
    """F7 row 2 (TPR ≤ 0.0306 at 1 %): 500 inserted canaries all above 500 held-out ones is far beyond it."""
    event = DpSgdEvent(sample_rate=32 / 4214, noise_multiplier=0.417, steps=12)
    scores = [1.0 + i for i in range(500)] + [-1.0 - i for i in range(500)]
    inserted = [True] * 500 + [False] * 500
    out = power.ceiling_comparison(scores, inserted, event)
    assert out["exceeded"]
    one = next(p for p in out["points"] if p["fpr"] == 0.01)
    assert one["ceiling"] == pytest.approx(0.0306, abs=0.002) and one["tpr"] == 1.0
