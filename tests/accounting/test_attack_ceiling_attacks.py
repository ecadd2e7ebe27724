"""Attacks on the attack ceiling (dplora.accounting.ceiling): inputs where the stated ceiling could fall below what a
membership test reaches.

Each ``test_*_finding_*`` holds a fix; the ``held_*`` tests are the attacks that held, kept as regressions.
References are independent of dplora's PLD code: the exact Gaussian trade-off curve TPR(α) = Φ(Φ⁻¹(α) + μ) (Dong,
Roth & Su 2022, Def. 2.4) at q = 1, and the exact Neyman-Pearson curve of one Poisson-subsampled Gaussian (T = 1;
likelihood ratio monotone in x, so threshold tests are optimal), both directions of add/remove and dp_accounting's
replace-one pair N(−1)/N(+1) mixtures.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm
from support.ceiling_attacks import gaussian_tpr

from dplora.accounting.ceiling import ceiling_entry, computed, tradeoff_tpr
from dplora.accounting.events import Adjacency, DpSgdEvent

FPRS = (0.001, 0.01, 0.1)


def _one_step_tpr(q: float, sigma: float, adjacency: Adjacency, alpha: float) -> float:
    """Exact ceiling of one Poisson-subsampled Gaussian step (max over both test directions)."""
    sf = norm.sf
    if adjacency is Adjacency.ADD_REMOVE:
        p0 = lambda t: sf(t / sigma)  # noqa: E731  (without the unit)
        p1 = lambda t: (1 - q) * sf(t / sigma) + q * sf((t - 1) / sigma)  # noqa: E731  (with it)
        forward = p1(brentq(lambda t: p0(t) - alpha, -60, 60, xtol=1e-14))
        backward_t = brentq(lambda t: (1 - p1(t)) - alpha, -60, 60, xtol=1e-14)
        return max(forward, 1 - p0(backward_t))
    p0 = lambda t: (1 - q) * sf(t / sigma) + q * sf((t + 1) / sigma)  # noqa: E731
    p1 = lambda t: (1 - q) * sf(t / sigma) + q * sf((t - 1) / sigma)  # noqa: E731
    return p1(brentq(lambda t: p0(t) - alpha, -60, 60, xtol=1e-14))


def test_finding_nan_profile_gives_the_most_optimistic_ceiling():
    """``tradeoff_tpr`` on a profile dp_accounting returned as NaN (``_profile`` silences all numpy errors) states
    TPR = α, 'no test beats guessing', instead of refusing or 1.0; ``ceiling_entry`` catches only exceptions."""
    got = tradeoff_tpr(np.full(3, np.nan), np.array([0.0, 1.0, 2.0]), 0.01)
    assert got == 1.0


@pytest.mark.parametrize("adjacency", list(Adjacency))
@pytest.mark.parametrize(("sigma", "steps"), [(1.0, 1), (2.0, 4), (0.5, 1), (5.0, 100)])
@pytest.mark.parametrize("interval", [1e-2, 1e-3])
def test_held_q1_ceiling_is_above_the_exact_gaussian_curve(adjacency, sigma, steps, interval):
    event = DpSgdEvent(sample_rate=1.0, noise_multiplier=sigma, steps=steps, adjacency=adjacency)
    scale = 2.0 if adjacency is Adjacency.REPLACE_ONE else 1.0
    got = computed(event, interval, FPRS)
    for alpha, tpr in zip(FPRS, got, strict=True):
        exact = gaussian_tpr(scale * math.sqrt(steps) / sigma, alpha)
        assert exact - 1e-9 <= tpr <= exact + 2e-3


@pytest.mark.parametrize("adjacency", list(Adjacency))
@pytest.mark.parametrize(("q", "sigma"), [(0.01, 0.6), (0.5, 0.3), (0.9, 1.0), (0.999, 3.0)])
def test_held_one_step_ceiling_at_the_coarsest_interval_is_above_the_exact_curve(adjacency, q, sigma):
    event = DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=1, adjacency=adjacency)
    got = computed(event, 1e-2, FPRS)
    for alpha, tpr in zip(FPRS, got, strict=True):
        exact = _one_step_tpr(q, sigma, adjacency, alpha)
        assert exact - 1e-9 <= tpr <= exact + 0.02  # upper side: tightness only


@pytest.mark.parametrize("sigma", [2.214, 8.2])
def test_finding_plain_words_ceiling_rounds_down(sigma):
    """The card, ``verify`` and ``budget`` state the ceiling as "no test ... can exceed X %" with X rounded to the
    nearest 0.1 %: at q = 1, T = 1, σ = 8.2 (exact μ = 1/8.2) the ceiling at 0.1 % FPR is 0.1497 % and the sentence
    says 0.1 % (a third lower, 'no better than guessing'); at σ = 2.214 the 1 % ceiling 3.042 % reads 3.0 %."""
    from dplora.accounting.ceiling import ceiling_sentence

    event = DpSgdEvent(sample_rate=1.0, noise_multiplier=sigma, steps=1)
    said = ceiling_sentence(ceiling_entry(event, use_cache=False))
    one = float(re.search(r"exceed ([0-9.]+) % true positives at 1 %", said).group(1)) / 100
    tenth = float(re.search(r"([0-9.]+) % at 0\.1 %", said).group(1)) / 100
    assert one >= gaussian_tpr(1 / sigma, 0.01), said
    assert tenth >= gaussian_tpr(1 / sigma, 0.001), said
