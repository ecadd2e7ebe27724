"""``dplora budget --plot`` draws the f-DP trade-off curve (the attack ceiling at every FPR) beside ε over steps
(issue 46 item 3), from the plan's public q, σ, T and adjacency only.

References: at q = 1 the exact Gaussian curve TPR(α) = Φ(Φ⁻¹(α) + √T/σ) (Dong, Roth & Su 2022, Def. 2.4), computed
here with scipy; at q < 1 ``../shared/cases/README.md`` F7 row 1 (q 0.01, σ 1, T 1000: TPR 0.0291 at FPR 1 %).
"""

from __future__ import annotations

import math

import pytest
from PIL import Image
from scipy.stats import norm

from dplora.tuning.budget import plot_curve

pytestmark = pytest.mark.usefixtures("fresh_cache")  # a calibration cache of each test's own


def _report(q: float, sigma: float, steps: int) -> dict:
    return {
        "epsilon_curve": [[t, 0.1 * t] for t in range(1, steps + 1)],
        "accountant": "rdp",
        "target_epsilon": 8.0,
        "delta": 1e-5,
        "sample_rate": q,
        "noise_multiplier": sigma,
        "steps": steps,
        "adjacency": "add_remove",
        "attack_ceiling": {"available": True},
    }


def test_plot_draws_the_exact_gaussian_tradeoff_at_q1(tmp_path):
    out = tmp_path / "plan.png"
    curve = plot_curve(_report(1.0, 2.0, 4), out)  # μ = √4/2 = 1
    assert len(curve["fpr"]) == 64 and curve["fpr"][0] == pytest.approx(1e-4)
    for alpha, tpr in zip(curve["fpr"], curve["tpr"], strict=True):
        assert tpr == pytest.approx(norm.cdf(norm.ppf(alpha) + 1.0), abs=1e-12)
    one = min(range(64), key=lambda i: abs(math.log(curve["fpr"][i] / 0.01)))
    assert curve["tpr"][one] > curve["fpr"][one]  # above guessing
    with Image.open(out) as image:
        assert image.size == (1100, 400)  # two panels: ε over steps and the trade-off curve


def test_plot_tradeoff_curve_at_q_below_1_is_the_pld_ceiling(tmp_path):
    from dplora.accounting.ceiling import attack_ceiling
    from dplora.accounting.events import DpSgdEvent

    curve = plot_curve(_report(0.01, 1.0, 1000), tmp_path / "plan.png")
    tprs = curve["tpr"]
    assert all(a <= t <= 1.0 for a, t in zip(curve["fpr"], tprs, strict=True))
    assert all(b >= a - 1e-12 for a, b in zip(tprs, tprs[1:], strict=False))  # a trade-off curve rises with α
    at_one = attack_ceiling(DpSgdEvent(sample_rate=0.01, noise_multiplier=1.0, steps=1000), fprs=(0.01,))
    assert at_one.tprs[0] == pytest.approx(0.0291, abs=0.002)  # F7 row 1, read off the same profile
    assert min(tprs) < at_one.tprs[0] < max(tprs)


def test_plot_without_dp_draws_no_curve(tmp_path):
    report = {**_report(1.0, 2.0, 4), "attack_ceiling": None}
    assert plot_curve(report, tmp_path / "plan.png") is None
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
