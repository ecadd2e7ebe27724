"""The one-run empirical ε lower bound of Steinke, Nasr & Jagielski (2023), with its δ term.

Source: T. Steinke, M. Nasr, M. Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023,
arXiv 2305.08846 (v1), Theorem 3 (the main theorem, stated for (ε, δ)-DP) and the bound computation of its
appendix. Setting: m canaries, each included independently with probability 1/2 (S ∈ {-1, +1}^m); the auditor
makes r guesses (the k₊ highest scores guessed "in", the k₋ lowest guessed "out", r = k₊ + k₋) and W counts the
correct ones. If training is (ε, δ)-DP then for every v

    P[W ≥ v] ≤ f(v) + 2·m·δ · max_{i ∈ {1..v}} (f(v − i) − f(v)) / i,      f(v) = P[Binomial(r, e^ε/(1+e^ε)) ≥ v].

At δ = 0 the second term vanishes and the bound is the plain binomial tail (Theorem 3 with δ = 0). The right-hand
side rises with ε; the reported lower bound is the largest ε whose right-hand side at the observed v is still
below 1 − confidence, i.e. every smaller ε is rejected at that confidence. No ε is rejected (bound 0) when even
ε = 0 is consistent with the count.
"""

from __future__ import annotations

import math

from scipy import stats


def p_value(*, m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The largest probability of ≥ v correct guesses out of r that (ε, δ)-DP allows (Theorem 3, arXiv 2305.08846).

    Args:
        m: canaries, each inserted independently with probability 1/2 (a count).
        r: guesses made (abstentions excluded), 0 ≤ r ≤ m.
        v: correct guesses, 0 ≤ v ≤ r.
        epsilon: the ε of the null hypothesis (natural log, ≥ 0).
        delta: the δ of the null hypothesis (a probability in [0, 1]).

    Returns:
        The bound on P[W ≥ v], capped at 1.

    Raises:
        ValueError: on counts or privacy parameters out of range (the message names the value).
    """
    if not 0 <= v <= r <= m:
        raise ValueError(f"expected 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if not epsilon >= 0 or not 0 <= delta <= 1:
        raise ValueError(f"expected epsilon >= 0 and 0 <= delta <= 1, got epsilon={epsilon}, delta={delta}")
    q = 1.0 / (1.0 + math.exp(-epsilon))  # accuracy of ε-DP randomized response
    tail = float(stats.binom.sf(v - 1, r, q))  # f(v) = P[Binomial(r, q) ≥ v]
    worst = 0.0
    between = 0.0  # f(v − i) − f(v) = P[v − i ≤ Binomial(r, q) < v]
    for i in range(1, v + 1):
        between += float(stats.binom.pmf(v - i, r, q))
        worst = max(worst, between / i)
    return min(1.0, tail + 2.0 * m * delta * worst)


def epsilon_lower_bound(*, m: int, r: int, v: int, delta: float, confidence: float = 0.95, tol: float = 1e-6) -> float:
    """The largest ε that v correct guesses out of r rule out at the given confidence (arXiv 2305.08846, Thm 3).

    Args:
        m: canaries (a count); r: guesses; v: correct guesses (0 ≤ v ≤ r ≤ m).
        delta: the δ the lower bound is stated at (a probability; the claimed δ of the run).
        confidence: e.g. 0.95: every ε below the result has p-value < 1 − confidence.
        tol: bisection tolerance on ε.

    Returns:
        ε ≥ 0 (natural log). 0 when the count rules out nothing (e.g. v ≤ r/2).

    Raises:
        ValueError: on out-of-range counts, δ or confidence.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"expected 0 < confidence < 1, got confidence={confidence}")
    alpha = 1.0 - confidence

    def rejected(eps: float) -> bool:
        return p_value(m=m, r=r, v=v, epsilon=eps, delta=delta) < alpha

    if not rejected(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while rejected(hi):
        lo, hi = hi, 2.0 * hi
        if hi > 1e3:  # only the r = v = m, δ = 0 limit grows this far
            return lo
    while hi - lo > tol:
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if rejected(mid) else (lo, mid)
    return lo


def count_correct(scores: list[float], inserted: list[bool], *, k_in: int, k_out: int) -> tuple[int, int]:
    """Guess "in" for the k_in highest scores and "out" for the k_out lowest; return (r, v).

    Args:
        scores: one membership score per canary (higher = more likely inserted), length m.
        inserted: whether each canary was inserted (same length).
        k_in, k_out: guesses of each kind, k_in + k_out ≤ m (ties broken by canary order). A NaN score (a
            diverged run) ranks as least likely inserted, so the order is total and never depends on how
            Python's sort meets NaN; the guesses still depend on the scores alone, never on ``inserted``.

    Returns:
        (r, v): guesses made and correct guesses.

    Raises:
        ValueError: on lengths that differ or k_in + k_out > m.
    """
    m = len(scores)
    if len(inserted) != m or k_in < 0 or k_out < 0 or k_in + k_out > m:
        raise ValueError(
            f"expected len(scores) == len(inserted) >= k_in + k_out; got m={m}, k_in={k_in}, k_out={k_out}"
        )
    keys = [-math.inf if math.isnan(s) else s for s in map(float, scores)]
    order = sorted(range(m), key=lambda i: (-keys[i], i))
    guessed_in = order[:k_in]
    guessed_out = order[m - k_out :] if k_out else []
    v = sum(inserted[i] for i in guessed_in) + sum(not inserted[i] for i in guessed_out)
    return k_in + k_out, v
