"""Audits that state their power (issue 46 item 2, issue 49): the ε̂ ceiling of (m, r) (F9), "uninformative"
below 1,000 canaries, and the measured TPR against the release's attack ceiling (exit 5 beyond its interval).

References: ../shared/cases/README.md F9 (Steinke, Nasr & Jagielski 2023; tolerance 1e-4; with v = r and δ 0 the
bound is logit(0.05^(1/r))) and F7 row 2 for the ceiling; Clopper-Pearson limits checked against hand values.
"""

from __future__ import annotations

import math

import pytest

from dplora.accounting.events import DpSgdEvent
from dplora.audit import power
from dplora.audit.bound import epsilon_lower_bound

pytestmark = pytest.mark.usefixtures("fresh_cache")  # a calibration cache of each test's own


@pytest.mark.parametrize(
    ("m", "r", "v", "eps0", "eps5"),
    [
        (1000, 100, 90, 1.6308, 1.6261),
        (1000, 100, 100, 3.4930, 3.4654),
        (1000, 500, 400, 1.1986, 1.1980),
        (10000, 1000, 900, 2.0212, 2.0152),
        (100, 20, 20, 1.8227, 1.8196),
        (1000, 100, 60, 0.0519, 0.0495),
    ],
)
def test_f9_bounds(m, r, v, eps0, eps5):
    assert epsilon_lower_bound(m=m, r=r, v=v, delta=0.0) == pytest.approx(eps0, abs=1e-4)
    assert epsilon_lower_bound(m=m, r=r, v=v, delta=1e-5) == pytest.approx(eps5, abs=1e-4)


def test_measured_tpr_by_hand():
    """10 held out (scores 0..9), 4 inserted (9.5, 8.5, 3.5, -1); α = 10 %: j = 1, threshold 8 (the second
    highest held-out score), so 9 is the one false positive and 9.5, 8.5 are true positives: TPR 2/4."""
    scores = [float(s) for s in range(10)] + [9.5, 8.5, 3.5, -1.0]
    inserted = [False] * 10 + [True] * 4
    p = power.measured_tpr(scores, inserted, 0.1)
    assert (p["false_positives"], p["held_out"], p["true_positives"], p["inserted"]) == (1, 10, 2, 4)
    assert p["tpr"] == 0.5
    # Clopper-Pearson at one-sided 2.5 %: lower of 2/4 = 0.0676 (beta.ppf(0.025, 2, 3)); upper of 1/10 = 0.4450
    assert p["tpr_lower"] == pytest.approx(0.067585, abs=1e-5)
    assert p["fpr_upper"] == pytest.approx(0.445016, abs=1e-5)
    assert power.measured_tpr(scores, [True] * 14, 0.1) is None


def test_chance_scores_stay_under_the_ceiling_and_no_dp_has_none():
    event = DpSgdEvent(sample_rate=32 / 4214, noise_multiplier=0.417, steps=12)
    scores = [((i * 7919) % 1000) / 1000 for i in range(1000)]  # a fixed shuffle: membership independent of score
    inserted = [i % 2 == 0 for i in range(1000)]
    out = power.ceiling_comparison(scores, inserted, event)
    assert not out["exceeded"] and len(out["points"]) == 3
    assert all(p["tpr_lower"] <= p["ceiling_at_fpr_upper"] for p in out["points"])
    none = power.ceiling_comparison(scores, inserted, None)
    assert not none["exceeded"] and all(p["ceiling"] is None for p in none["points"])


def test_nan_scores_are_read_as_the_attackers_best_guess_at_half_the_error_each():
    """NaN has no order: 10 held out (0..9) and 4 inserted scoring NaN. Read as −∞ the inserted canaries are never
    above the threshold (TPR 0); read as +∞ all 4 are (TPR 1, lower limit (0.0125)^(1/4) = 0.3344 at one-sided
    1.25 %, half of 2.5 %: the two readings share the error). The attacker's reading is +∞."""
    scores = [float(s) for s in range(10)] + [math.nan] * 4
    inserted = [False] * 10 + [True] * 4
    out = power.ceiling_comparison(scores, inserted, None)
    assert out["nan_scores"] == 4
    ten = next(p for p in out["points"] if p["fpr"] == 0.1)
    assert (ten["nan_read_as"], ten["true_positives"], ten["tpr"]) == ("+inf", 4, 1.0)
    assert ten["tpr_lower"] == pytest.approx(0.0125**0.25, abs=1e-9)
    # NaN everywhere shows nothing either way (no order at all): TPR 0, never a violation
    event = DpSgdEvent(sample_rate=1.0, noise_multiplier=2.0, steps=4)
    blank = power.ceiling_comparison([math.nan] * 14, inserted, event)
    assert not blank["exceeded"] and all(p["tpr"] == 0.0 for p in blank["points"])
