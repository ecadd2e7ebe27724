"""How much an audit can show: the ceiling its canary count imposes, and the attack's TPR against the release's.

Two ceilings bound what a canary audit may conclude:

- **The audit's own ceiling** (``../shared/cases`` F9): with m canaries and r guesses the largest ε lower bound the
  one-run audit (Steinke, Nasr & Jagielski 2023, Thm 3; :mod:`dplora.audit.bound`) can ever report is its value at
  v = r (every guess correct); at δ = 0 that is logit(0.05^(1/r)) (3.4930 for r = 100, 5.8091 for r = 1000).
  An audit whose ceiling is at or below the claimed ε cannot detect a violation whatever training did, and one with
  fewer than :data:`MIN_INFORMATIVE_CANARIES` canaries is reported **uninformative** rather than passed.
- **The release's attack ceiling** (:mod:`dplora.accounting.ceiling`): no membership test reaches a TPR above
  TPR(α) at false-positive rate α. The audit's scores give a measured test: threshold at the (j+1)-th highest
  held-out canary score, j = ⌊α·n_out⌋ (so at most j false positives among the n_out held-out canaries), and
  TPR = inserted canaries scoring above it. The true FPR of that threshold is Beta(j+1, n_out − j) distributed
  (an order statistic), so its upper confidence bound is the Clopper-Pearson upper limit of j/n_out; the TPR's
  lower bound is the Clopper-Pearson lower limit of k/n_in (Clopper & Pearson 1934). Each at one-sided level
  (1 − confidence)/2, so both hold together at ``confidence`` (union bound). A measured TPR whose lower limit is
  above the release's ceiling at the FPR's upper limit is a failed audit (exit 5).

Everything here reads canary scores (fake secrets, never private text) and the mechanism's public q, σ, T.
"""

from __future__ import annotations

import math

from dplora.audit.bound import epsilon_lower_bound

MIN_INFORMATIVE_CANARIES = 1000  # fewer canaries report "uninformative", never a pass
AUDIT_FPRS = (0.001, 0.01, 0.1)


def bound_ceiling(*, m: int, r: int, delta: float, confidence: float = 0.95) -> float:
    """The largest ε lower bound an audit with m canaries and r guesses can ever report (all r guesses correct).

    Args:
        m: canaries; r: guesses (1 ≤ r ≤ m).
        delta: the δ the bound is stated at; confidence: e.g. 0.95.

    Returns:
        ε ≥ 0 (natural log); logit((1 − confidence)^(1/r)) at δ = 0 (F9).

    Raises:
        ValueError: out-of-range counts, δ or confidence.
    """
    return epsilon_lower_bound(m=m, r=r, v=r, delta=delta, confidence=confidence)


def _clopper_pearson(k: int, n: int, level: float) -> tuple[float, float]:
    """(lower, upper) one-sided Clopper-Pearson limits of a binomial proportion k/n, each at error ``level``."""
    from scipy import stats

    lower = 0.0 if k == 0 else float(stats.beta.ppf(level, k, n - k + 1))
    upper = 1.0 if k == n else float(stats.beta.ppf(1.0 - level, k + 1, n - k))
    return lower, upper


def measured_tpr(scores: list[float], inserted: list[bool], fpr: float, *, confidence: float = 0.95) -> dict | None:
    """The audit's membership test at false-positive rate ``fpr``: its TPR with confidence limits.

    Args:
        scores: one score per canary (higher: more likely inserted).
        inserted: whether each canary was inserted (same length).
        fpr: the target false-positive rate α ∈ (0, 1).
        confidence: joint level of the TPR lower and FPR upper limits.

    Returns:
        ``{"fpr", "false_positives", "held_out", "fpr_upper", "true_positives", "inserted", "tpr", "tpr_lower"}``
        (rates are probabilities); None when there are no inserted or no held-out canaries.

    Raises:
        ValueError: lengths differ, or α or ``confidence`` out of (0, 1).
    """
    if len(scores) != len(inserted) or not 0 < fpr < 1 or not 0 < confidence < 1:
        raise ValueError(f"expected equal lengths and 0 < fpr, confidence < 1; got {len(scores)}, {len(inserted)}")
    members = [s for s, i in zip(scores, inserted, strict=True) if i]
    others = sorted((s for s, i in zip(scores, inserted, strict=True) if not i), reverse=True)
    if not members or not others:
        return None
    j = math.floor(fpr * len(others))
    threshold = others[j] if j < len(others) else -math.inf
    positives = sum(s > threshold for s in members)
    false_positives = sum(s > threshold for s in others)  # ≤ j (ties at the threshold count as negatives)
    level = (1.0 - confidence) / 2.0
    tpr_lower, _ = _clopper_pearson(positives, len(members), level)
    _, fpr_upper = _clopper_pearson(j, len(others), level)  # the order statistic's Beta(j+1, n-j) upper limit
    return {
        "fpr": fpr,
        "false_positives": false_positives,
        "held_out": len(others),
        "fpr_upper": fpr_upper,
        "true_positives": positives,
        "inserted": len(members),
        "tpr": positives / len(members),
        "tpr_lower": tpr_lower,
    }


def ceiling_comparison(scores, inserted, event, *, confidence: float = 0.95) -> dict:
    """The measured TPR at each of :data:`AUDIT_FPRS` against the mechanism's attack ceiling.

    Args:
        scores, inserted: the canaries' scores and membership.
        event: the audited run's :class:`~dplora.accounting.events.DpSgdEvent` (None: a run without DP, no ceiling).
        confidence: joint level of each comparison.

    Returns:
        ``{"points": [...], "exceeded": bool, "confidence", "nan_scores"}``: each point is :func:`measured_tpr`'s
        dict plus ``ceiling`` (the release's TPR ceiling at α), ``ceiling_at_fpr_upper`` and ``exceeded``
        (tpr_lower above ceiling_at_fpr_upper); ``exceeded`` overall when any point is. Ceilings are None without
        DP or when the ceiling is not stated. NaN scores (``nan_scores`` counts them) are read as the attacker's
        best guess (:func:`_best_of_nan_readings`): a NaN never lowers the measured TPR below what either fixed
        reading shows.
    """
    from dplora.accounting.ceiling import attack_ceiling

    nans = sum(1 for s in scores if s != s)  # noqa: PLR0124  (NaN is the one value unequal to itself)
    points = []
    for fpr in AUDIT_FPRS:
        point = (
            _best_of_nan_readings(scores, inserted, fpr, confidence)
            if nans
            else measured_tpr(scores, inserted, fpr, confidence=confidence)
        )
        if point is None:
            continue
        nominal = upper = None
        if event is not None:
            upper_fpr = min(point["fpr_upper"], 1.0 - 1e-12)
            ceiling = attack_ceiling(event, fprs=(fpr, upper_fpr))
            if ceiling is not None:
                nominal, upper = ceiling.tprs
        point |= {
            "ceiling": nominal,
            "ceiling_at_fpr_upper": upper,
            "exceeded": upper is not None and point["tpr_lower"] > upper,
        }
        points.append(point)
    return {
        "points": points,
        "exceeded": any(p["exceeded"] for p in points),
        "confidence": confidence,
        "nan_scores": nans,
    }


def _best_of_nan_readings(scores, inserted, fpr: float, confidence: float) -> dict | None:
    """:func:`measured_tpr` with NaN scores read as the attacker's best guess, never as a free pass.

    A NaN score (a diverged adapter: inf − inf) has no order, and sorting through it makes the threshold NaN, so
    nothing scores above it: TPR 0 and no violation, whatever the other canaries show. Both
    fixed readings of NaN are valid tests (a fixed function of each score, blind to membership): NaN as +∞ (most
    likely inserted) and NaN as −∞. The attacker takes the one with the higher TPR lower limit; each is computed at
    half the error, (1 − confidence)/2, so the one chosen still holds at ``confidence`` (union bound over the two).

    Returns:
        :func:`measured_tpr`'s dict plus ``"nan_read_as"`` (``"+inf"`` or ``"-inf"``), or None as it does.
    """
    half = 1.0 - (1.0 - confidence) / 2.0
    best = None
    for label, value in (("+inf", math.inf), ("-inf", -math.inf)):
        read = [value if s != s else s for s in scores]  # noqa: PLR0124
        point = measured_tpr(read, inserted, fpr, confidence=half)
        if point is not None and (best is None or point["tpr_lower"] > best["tpr_lower"]):
            best = point | {"nan_read_as": label}
    return best


def informativeness(*, m: int, r: int, delta: float, claimed_epsilon: float, confidence: float = 0.95) -> dict:
    """Whether the audit could detect a violation of ``claimed_epsilon``, and the ε̂ ceiling its (m, r) imposes.

    Returns:
        ``{"epsilon_lower_bound_ceiling", "epsilon_lower_bound_ceiling_delta0", "informative", "reasons"}``:
        uninformative when m < :data:`MIN_INFORMATIVE_CANARIES` or when the ceiling is at or below the
        claimed ε (no outcome could exceed it).
    """
    ceiling = bound_ceiling(m=m, r=r, delta=delta, confidence=confidence)
    reasons = []
    if m < MIN_INFORMATIVE_CANARIES:
        reasons.append(f"{m} canaries, fewer than {MIN_INFORMATIVE_CANARIES}")
    if math.isfinite(claimed_epsilon) and ceiling <= claimed_epsilon:
        reasons.append(
            f"{r} guesses on {m} canaries can show at most ε̂ = {ceiling:.4f}, not above the claimed ε = "
            f"{claimed_epsilon:.4f}: no training outcome could fail it"
        )
    return {
        "epsilon_lower_bound_ceiling": ceiling,
        "epsilon_lower_bound_ceiling_delta0": bound_ceiling(m=m, r=r, delta=0.0, confidence=confidence),
        "informative": not reasons,
        "reasons": reasons,
    }


def verdict(*, bound_violation: bool, ceiling_exceeded: bool, informative: bool) -> str:
    """``"violation"`` (exit 5) when the ε bound exceeds the claim or a TPR exceeds the ceiling; else
    ``"uninformative"`` or ``"no violation detected"``. A violation stands at any canary count: the bound holds at
    its confidence whatever m is."""
    if bound_violation or ceiling_exceeded:
        return "violation"
    return "no violation detected" if informative else "uninformative"
