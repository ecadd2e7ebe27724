"""The one-run ε lower bound (Steinke, Nasr & Jagielski 2023, arXiv 2305.08846, Theorem 3) against hand values."""

import math

import pytest

from dplora.audit.bound import count_correct, epsilon_lower_bound, p_value


def test_all_correct_bound_rises_with_r():
    for delta in (0.0, 1e-5):
        bounds = [epsilon_lower_bound(m=1000, r=r, v=r, delta=delta) for r in (5, 10, 20, 50, 100, 200)]
        assert all(a < b for a, b in zip(bounds, bounds[1:], strict=False)), bounds
        assert bounds[0] > 0


def test_half_correct_is_zero():
    for r in (10, 50, 200):
        assert epsilon_lower_bound(m=1000, r=r, v=r // 2, delta=0.0) == 0.0
        assert epsilon_lower_bound(m=1000, r=r, v=r // 2, delta=1e-5) == 0.0


def test_delta_zero_is_the_binomial_tail_closed_form():
    # δ = 0, all r correct: P[W ≥ r] = q^r with q = e^ε/(1+e^ε); the bound solves q^r = 0.05, ε = ln(q/(1−q)).
    for r in (10, 30, 100):
        q = 0.05 ** (1 / r)
        assert epsilon_lower_bound(m=1000, r=r, v=r, delta=0.0) == pytest.approx(math.log(q / (1 - q)), abs=1e-5)
    # r = 10: q = 0.741134..., ε = 1.05187 (hand-computed).
    assert epsilon_lower_bound(m=1000, r=10, v=10, delta=0.0) == pytest.approx(1.05187, abs=1e-4)
    # p-value at ε = 1, r = v = 10: (e/(1+e))^10 = 0.0436035.
    assert p_value(m=100, r=10, v=10, epsilon=1.0, delta=0.0) == pytest.approx(0.0436035, abs=1e-6)


def test_delta_term_hand_computed():
    # ε = 0, r = v = 2, m = 100, δ = 0.001: f(2) = 1/4; (f(1) − f(2))/1 = P[B=1] = 1/2; (f(0) − f(2))/2 = 3/8;
    # p = 1/4 + 2·100·0.001·max(1/2, 3/8) = 0.25 + 0.1 = 0.35.
    assert p_value(m=100, r=2, v=2, epsilon=0.0, delta=0.001) == pytest.approx(0.35, abs=1e-12)
    # ε = ln 3 (q = 3/4), r = v = 3, m = 10, δ = 0.01: f(3) = 27/64; P[B=2] = 27/64, P[B=1] = 9/64, P[B=0] = 1/64;
    # max(27/64, 36/64/2, 37/64/3) = 27/64; p = 27/64 + 2·10·0.01·27/64 = 1.2·27/64 = 0.50625.
    assert p_value(m=10, r=3, v=3, epsilon=math.log(3), delta=0.01) == pytest.approx(0.50625, abs=1e-12)


def test_delta_lowers_the_bound_and_bound_sits_at_the_threshold():
    for delta in (1e-6, 1e-5, 1e-4):
        eps = epsilon_lower_bound(m=1000, r=100, v=100, delta=delta)
        assert eps < epsilon_lower_bound(m=1000, r=100, v=100, delta=0.0)
        assert p_value(m=1000, r=100, v=100, epsilon=eps, delta=delta) == pytest.approx(0.05, abs=1e-5)
    # 2·m·δ = 2 and at ε = 0 the max term is ≥ P[10 ≤ B < 20]/10 ≈ 0.05: the δ term alone exceeds 0.05.
    assert epsilon_lower_bound(m=1000, r=20, v=20, delta=1e-3) == 0.0


def test_count_correct_and_bad_input():
    scores = [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    inserted = [True, True, False, True, False, False]
    assert count_correct(scores, inserted, k_in=2, k_out=2) == (4, 4)
    assert count_correct(scores, inserted, k_in=3, k_out=0) == (3, 2)
    with pytest.raises(ValueError, match="k_in"):
        count_correct(scores, inserted, k_in=4, k_out=3)
    with pytest.raises(ValueError, match="v=5"):
        p_value(m=10, r=4, v=5, epsilon=1.0, delta=0.0)


def test_count_correct_ranks_nan_as_least_likely_inserted():
    """A diverged canary score is NaN; the guesses must not depend on where Python's sort happens to meet it."""
    nan = float("nan")
    inserted = [True, False, True, False, True, False]
    # NaN goes to the "out" end: with k_out=2 the two lowest are the NaN (index 1) and index 3's 0.5
    assert count_correct([3.0, nan, 2.0, 0.5, 1.0, 0.7], inserted, k_in=2, k_out=2) == (4, 4)
    # the same scores in another order give the same guesses for the same canaries
    perm = [5, 3, 1, 4, 0, 2]
    scores = [[3.0, nan, 2.0, 0.5, 1.0, 0.7][i] for i in perm]
    assert count_correct(scores, [inserted[i] for i in perm], k_in=2, k_out=2) == (4, 4)
    # a NaN among the top scores is never guessed "in"
    assert count_correct([nan, 1.0, 0.0], [True, True, False], k_in=1, k_out=0) == (1, 1)


def test_the_report_prints_ceilings_rounded_up():
    """A ceiling shown to 3 or 4 decimals is never below its value (red team round 2 of issue 46)."""
    from dplora.audit.summary import rounded_up

    assert rounded_up(0.12341, 4) == "0.1235"
    assert rounded_up(1.5790001, 3) == "1.580"
    assert rounded_up(0.25, 2) == "0.25"
    # in binary, x * 10**d rounds: 0.0051 printed 0.0052, and one float step above 0.0009 printed 0.0009 (below it)
    assert rounded_up(0.0051, 4) == "0.0051"
    assert rounded_up(math.nextafter(0.0009, 1.0), 4) == "0.0010"
    for k in range(1, 10_000):  # every 4-decimal value stays; the next float up is never printed below its value
        assert rounded_up(k / 1e4, 4) == f"{k / 1e4:.4f}"
        assert float(rounded_up(math.nextafter(k / 1e4, 1.0), 4)) >= math.nextafter(k / 1e4, 1.0)
    assert rounded_up(1e300, 2).endswith(".00") and rounded_up(1e-9, 4) == "0.0001"
