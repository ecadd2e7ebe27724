"""What ε means to an attacker: the highest true-positive rate any membership test can reach on a mechanism.

A membership test (did unit u's data take part?) is a hypothesis test between the mechanism on neighbouring
datasets. For a mechanism with privacy profile δ(ε) (its hockey-stick divergences, both directions), every test
with false-positive rate α has true-positive rate at most

    TPR(α) ≤ min over ε ≥ 0 of min{ e^ε·α + δ(ε),  1 − e^(−ε)·(1 − δ(ε) − α) }

(the f-DP trade-off curve of the profile: Dong, Roth & Su 2022, Prop. 2.12 / Kairouz, Oh & Viswanath 2015; the
second term is the same inequality applied to the test's complement). ε runs over a grid 0–30 in steps of 0.01
(``EPS_GRID``); every grid point gives a valid bound, so the grid only costs tightness. δ(ε) comes from
dp_accounting's pessimistic PLD of the whole T-step mechanism (``from_gaussian_mechanism`` then ``self_compose``,
Doroshenko et al. 2022), an upper bound on the true profile, so the ceiling is an upper bound too. It reproduces
``../shared/cases`` F7 (which used dp_accounting's ``PldPrivacyAccountant.get_true_positive_rates``, main branch
2026) within ±0.002 and in fact to 4 decimals.

The ceiling is a function of the mechanism only: q, σ, T and the adjacency, the public numbers of the release
record's ``mechanism`` entry. It never reads data, a private count or a single (ε, δ) pair (the single-pair bound
e^ε·α + δ is vacuous, 1.0, at ε ≈ 7 and α = 1 %). It holds for one release; releases on the same population
compose (``dplora ledger``) and their joint ceiling is higher.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from dplora.accounting.cost import PLD_MAX_SECONDS, pld_seconds
from dplora.accounting.events import Adjacency, DpSgdEvent

CEILING_FPRS = (0.001, 0.01, 0.1)  # the false-positive rates every release reports
EPS_GRID = np.arange(3001) / 100.0  # ε = 0, 0.01, ..., 30 (F7's grid)
# Discretisation intervals tried in order (finest first); a coarser pessimistic PLD is still an upper bound.
CEILING_INTERVALS = (1e-4, 1e-3, 1e-2)
METHOD = (
    "f-DP trade-off of the PLD privacy profile: TPR(α) = min over ε in 0..30 (step 0.01) of "
    "min(e^ε·α + δ(ε), 1 − e^(−ε)·(1 − δ(ε) − α)); δ(ε) from dp_accounting's pessimistic PLD of the T-step "
    "mechanism at the public q, σ and adjacency"
)

GAUSSIAN_METHOD = (
    "exact Gaussian trade-off at q = 1: TPR(α) = Φ(Φ⁻¹(α) + μ), μ = s·√T/σ (s = 1 add/remove, 2 replace-one), "
    "the T-fold composition of the Gaussian mechanism (Dong, Roth & Su 2022, Def. 2.4 and Cor. 3.3); no PLD"
)
# The ceiling's own PLD cost, as priced when the interval rule was fixed: dp_accounting's FFT self-composition and
# δ(ε) on EPS_GRID (then its Python loop over every composed point) cost about 14 µs per composed pmf point on the
# reference machine (measured 2026-12-03, loaded: q 1, σ 100, T 10^6 at 1e-4: 5.26e6 points, 26 s composing and
# 46 s for δ(ε); q 0.5, σ 20, T 10^5: 46 s). δ(ε) is now array operations (:func:`profile_deltas`), so the price
# overstates the time; it is kept because `verify` re-derives the interval from it, and a new price would move the
# interval (and the ceiling) of releases already recorded. The accountant's cost model (dplora.accounting.cost)
# prices one ε only and predicted 0.8-1.2 s for these.
CEILING_POINT_SECONDS = 1.4e-5


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttackCeiling:
    """The membership-test ceiling of one mechanism.

    Attributes:
        fprs: false-positive rates α (probabilities in (0, 1)).
        tprs: the highest true-positive rate any test reaches at each α (probabilities in [α, 1]), same order.
        interval: the PLD value discretisation interval used (ε units; 0.0: a closed form, no PLD).
        accountant_version: e.g. ``"dp-accounting 0.6.0"``.
        method: how the TPRs were computed (:data:`METHOD` or :data:`GAUSSIAN_METHOD`).
    """

    fprs: tuple[float, ...]
    tprs: tuple[float, ...]
    interval: float
    accountant_version: str
    method: str = METHOD

    def at(self, fpr: float) -> float:
        """The ceiling at false-positive rate ``fpr`` (one of :attr:`fprs`). Raises KeyError otherwise."""
        for a, t in zip(self.fprs, self.tprs, strict=True):
            if math.isclose(a, fpr, rel_tol=1e-12):
                return t
        raise KeyError(fpr)

    def to_dict(self) -> dict:
        """The release record's ``attack_ceiling`` entry (JSON-ready; TPRs rounded UP to 6 decimals)."""
        return {
            "true_positive_rate_at": {fpr_label(a): round_up(t) for a, t in zip(self.fprs, self.tprs, strict=True)},
            "method": self.method,
            "pld_interval": self.interval,
            "accountant_version": self.accountant_version,
            "scope": "this release alone; releases on the same population compose and their ceiling is higher",
        }


def fpr_label(fpr: float) -> str:
    """``0.001`` → ``"0.1%"``, ``0.01`` → ``"1%"``, ``0.1`` → ``"10%"`` (the record's keys)."""
    return f"{fpr * 100:g}%"


def tradeoff_tpr(deltas: np.ndarray, eps: np.ndarray, fpr: float) -> float:
    """TPR ceiling at ``fpr`` from a privacy profile sampled at ``eps`` (the formula of the module docstring).

    Args:
        deltas: δ(ε) at each ε of ``eps`` (shape [K], probabilities), an upper bound of the true profile.
        eps: ε values ≥ 0 (shape [K], natural-log units).
        fpr: α ∈ [0, 1].

    Returns:
        A probability in [α, 1].

    Raises:
        ValueError: shapes differ or α is outside [0, 1].
    """
    deltas, eps = np.asarray(deltas, dtype=float), np.asarray(eps, dtype=float)
    if deltas.shape != eps.shape or not 0.0 <= fpr <= 1.0:
        raise ValueError(f"expected matching shapes and 0 <= fpr <= 1, got {deltas.shape}, {eps.shape}, {fpr}")
    if len(eps) and not np.isfinite(deltas).all():
        return 1.0  # a profile with a NaN/inf is no bound at all: the most pessimistic ceiling, never α
    with np.errstate(over="ignore", invalid="ignore"):
        first = np.exp(eps) * fpr + deltas
        second = 1.0 - np.exp(-eps) * (1.0 - deltas - fpr)
        bound = np.nanmin(np.minimum(first, second)) if len(eps) else 1.0
    return float(min(1.0, max(fpr, bound)))


def round_up(tpr: float, decimals: int = 6) -> float:
    """``tpr`` rounded UP at ``decimals`` decimals (capped at 1.0): a stored ceiling is never below its value.

    ``round`` to nearest would store 0.0300003 as 0.03, below the exact Gaussian curve."""
    scale = 10**decimals
    return min(1.0, math.ceil(tpr * scale) / scale)


def percent_up(tpr: float, digits: int = 1) -> str:
    """``tpr`` as a percentage rounded UP at ``digits`` decimals (a ceiling is never printed below its value):
    0.001497 → ``0.2``, 0.03042 → ``3.1``."""
    scale = 10**digits
    return f"{math.ceil(round(100 * tpr * scale, 9)) / scale:.{digits}f}"


@functools.lru_cache(maxsize=2)
def _one_step(sample_rate: float, noise_multiplier: float, adjacency: Adjacency, interval: float):
    """dp_accounting's pessimistic one-step PLD (memoised: sized first by :func:`composed_points`, then composed)."""
    import dp_accounting
    from dp_accounting.pld import privacy_loss_distribution

    relation = {
        Adjacency.ADD_REMOVE: dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        Adjacency.REPLACE_ONE: dp_accounting.NeighboringRelation.REPLACE_ONE,
    }[adjacency]
    with np.errstate(all="ignore"):
        return privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=noise_multiplier,
            value_discretization_interval=interval,
            sampling_prob=sample_rate,
            neighboring_relation=relation,
        )


def _profile(event: DpSgdEvent, interval: float) -> np.ndarray:
    """δ(ε) on ``EPS_GRID`` of the T-step mechanism (dp_accounting pessimistic PLD, both directions)."""
    one = _one_step(event.sample_rate, event.noise_multiplier, event.adjacency, interval)
    with np.errstate(all="ignore"):
        composed = one.self_compose(event.steps) if event.steps > 1 else one
        return profile_deltas(composed, EPS_GRID)


def profile_deltas(pld, epsilons: np.ndarray) -> np.ndarray:
    """δ(ε) at each of ``epsilons`` (ascending, finite) of a dp_accounting ``PrivacyLossDistribution``: bit for bit
    what its ``get_delta_for_epsilon(epsilons)`` returns, in array operations.

    dp_accounting 0.6's vectorised path (``pld_pmf._get_delta_for_epsilon_vectorized``) walks every pmf point in a
    Python loop (about 1.2 s of a cold ``budget`` at interval 1e-4). Its sums run from the largest loss down, in
    float64, one point at a time: ``np.cumsum`` over the reversed arrays is the same sequential sum (accumulate
    is never pairwise), so every δ is the same float and every recorded ceiling still verifies. A test compares
    the two on both adjacencies and the three ceiling intervals.

    Args:
        pld: a ``dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution``.
        epsilons: ε values (natural log), ascending.
    Returns:
        δ(ε), one per ε (probabilities), the larger of the remove and add directions.
    Raises:
        ValueError: ``epsilons`` is not ascending or not finite.
    Source: the hockey-stick divergence of a PLD, δ(ε) = μ(∞) + Σ_{l > ε} p_l·(1 − e^(ε−l)) (Meiser & Mohammadi
    2018; Doroshenko et al. 2022), as dp_accounting computes it.
    """
    eps = np.asarray(epsilons, dtype=float)
    if not (np.all(np.isfinite(eps)) and np.all(np.diff(eps) >= 0)):
        raise ValueError("epsilons must be finite and ascending")

    def one(pmf) -> np.ndarray:
        dense = pmf.to_dense_pmf()
        probs = dense._probs  # noqa: SLF001  (dp_accounting keeps the pmf private; its own method reads the same)
        losses = (np.arange(dense.size) + dense._lower_loss) * dense._discretization  # noqa: SLF001
        down = probs[::-1]
        upper = np.cumsum(np.concatenate(([dense._infinity_mass], down)))  # noqa: SLF001
        lower = np.cumsum(np.concatenate(([0.0], down * np.exp(-losses[::-1]))))
        above = len(losses) - np.searchsorted(losses, eps, side="right")  # points with loss > ε
        return upper[above] - np.exp(eps) * lower[above]

    remove = one(pld._pmf_remove)  # noqa: SLF001
    if pld._symmetric:  # noqa: SLF001
        return remove
    return np.maximum(remove, one(pld._pmf_add))  # noqa: SLF001


def composed_points(event: DpSgdEvent, interval: float) -> int:
    """The exact number of points of the composed pmfs dp_accounting will build for ``event`` (both directions).

    dp_accounting's ``self_compose`` sizes its FFT by a Chernoff bound on the one-step pmf
    (``dp_accounting.pld.common.compute_self_convolve_bounds``, tail mass 1e-15); the same call here gives the
    size before composing: a deterministic function of (q, σ, T, adjacency, interval). Building the one-step pmf
    is priced by :func:`dplora.accounting.cost.pld_seconds` (exact) and is checked first.
    """
    from dp_accounting.pld import common

    one = _one_step(event.sample_rate, event.noise_multiplier, event.adjacency, interval)
    pmfs = {id(pmf): pmf for pmf in (one._pmf_remove, one._pmf_add)}.values()  # noqa: SLF001  (one object under replace-one)
    total = 0
    with np.errstate(all="ignore"):
        for pmf in pmfs:
            probs = pmf.to_dense_pmf()._probs  # noqa: SLF001
            if event.steps <= 1:
                total += len(probs)
                continue
            lower, upper = common.compute_self_convolve_bounds(probs, event.steps, 1e-15)
            total += upper - lower + 1
    return total


def ceiling_seconds(event: DpSgdEvent, interval: float) -> float:
    """Predicted seconds of the ceiling's PLD (one-step pmf, composition and δ on ``EPS_GRID``), or ∞ when the
    one-step pmf alone is past the limit (then it is never built)."""
    seconds = pld_seconds(event, interval)
    if seconds > PLD_MAX_SECONDS:
        return math.inf
    return seconds + CEILING_POINT_SECONDS * composed_points(event, interval)


def ceiling_interval(event: DpSgdEvent, intervals: tuple[float, ...] = CEILING_INTERVALS) -> float | None:
    """The finest of ``intervals`` whose PLD fits dplora's PLD time limit for ``event`` (None: none does).

    The choice is a deterministic function of (q, σ, T, adjacency): dplora's cost model of the one-step pmf
    (:mod:`dplora.accounting.cost`) and the exact composed size (:func:`composed_points`) at
    :data:`CEILING_POINT_SECONDS` each, so ``verify`` picks the interval the record was computed with and its
    recomputation stays under about ``PLD_MAX_SECONDS`` (15 s) on the reference machine.
    """
    for interval in intervals:
        if ceiling_seconds(event, interval) <= PLD_MAX_SECONDS:
            return interval
    return None


def gaussian_tprs(event: DpSgdEvent, fprs: tuple[float, ...]) -> tuple[float, ...]:
    """The exact ceiling at q = 1: TPR(α) = Φ(Φ⁻¹(α) + μ), μ = s·√T/σ (s = 1 add/remove, 2 replace-one).

    The T-step full-batch mechanism is T Gaussian mechanisms of sensitivity s·C and noise σ·C, i.e. μ-GDP with
    μ = s·√T/σ (Dong, Roth & Su 2022, Def. 2.4, Cor. 3.3), and its trade-off curve is exactly Gaussian: no test
    does better, and one (the likelihood-ratio test) reaches it. Instant at any T and σ.

    Args:
        event: q must be 1 (probabilities α in (0, 1)).
    Returns:
        One TPR per α (probabilities).
    Raises:
        ValueError: q is not 1.
    """
    from scipy.stats import norm

    if event.sample_rate != 1.0:
        raise ValueError(f"the closed form holds at q = 1 only, got q = {event.sample_rate!r}")
    scale = 2.0 if event.adjacency is Adjacency.REPLACE_ONE else 1.0
    mu = scale * math.sqrt(event.steps) / event.noise_multiplier
    return tuple(float(min(1.0, max(a, norm.cdf(norm.ppf(a) + mu)))) for a in fprs)


def attack_ceiling(
    event: DpSgdEvent,
    fprs: tuple[float, ...] = CEILING_FPRS,
    *,
    use_cache: bool = False,
    intervals: tuple[float, ...] = CEILING_INTERVALS,
) -> AttackCeiling | None:
    """The highest TPR any membership test reaches at each false-positive rate, for the mechanism ``event``.

    At q = 1 the exact Gaussian curve (:func:`gaussian_tprs`, instant). Otherwise one PLD evaluation (about 1-15 s
    on the reference machine, bounded by :func:`ceiling_interval`; memoised within one process). A stated ceiling
    (record, card, ``budget``, audits, ``verify``) reads nothing from the on-disk cache: the file is writable by
    whoever shares the folder, a TPR edited down to α passes any range check, and a finer interval than the time
    limit allows gives a lower (still valid) value than ``verify`` recomputes. Only the planner's candidate table,
    a table to choose by, passes ``use_cache``.

    Args:
        event: q, σ, T and adjacency (public plan values; nothing else is read).
        fprs: false-positive rates α ∈ (0, 1) (pass many for the curve).
        use_cache: read and write the interval choice and the TPRs in dplora's on-disk cache
            (:mod:`dplora.accounting.cache`): the candidate table only.
        intervals: PLD discretisation intervals to try, finest first (the record uses the default; the planner's
            candidate table starts at 1e-3, ten times faster and still an upper bound).

    Returns:
        :class:`AttackCeiling`, or None when no PLD interval fits the time limit (the ceiling is then not
        stated, never guessed: ``verify`` never runs past the limit). T = 0 gives TPR = α; σ = 0 gives 1.

    Raises:
        ValueError: an α outside (0, 1).
    """
    from dplora.accounting.backends import accountant_version
    from dplora.accounting.events import Accountant

    if not all(0.0 < a < 1.0 for a in fprs):
        raise ValueError(f"false-positive rates must lie in (0, 1), got {fprs!r}")
    version = accountant_version(Accountant.PLD)
    if event.steps == 0 or event.noise_multiplier == 0.0:
        tprs = tuple(float(a) if event.steps == 0 else 1.0 for a in fprs)
        return AttackCeiling(fprs=tuple(fprs), tprs=tprs, interval=0.0, accountant_version=version)
    if event.sample_rate == 1.0:  # the Gaussian mechanism: exact and instant at any T (no PLD, nothing to cache)
        tprs = gaussian_tprs(event, tuple(fprs))
        return AttackCeiling(
            fprs=tuple(fprs), tprs=tprs, interval=0.0, accountant_version=version, method=GAUSSIAN_METHOD
        )
    # The interval choice prices the one-step pmf, which builds it (seconds, and dp_accounting's import): a
    # deterministic function of the public event, so the candidate table caches it beside its ceilings.
    choice_key = (
        f"ceiling-interval-v1/{version}/{event.sample_rate!r}/{event.noise_multiplier!r}/{event.steps}/"
        f"{event.adjacency.value}/{','.join(map(repr, intervals))}"
    )
    interval = _cached_interval(choice_key, intervals) if use_cache else None
    if interval is None:
        interval = ceiling_interval(event, intervals)
        if interval is None:
            return None
        if use_cache:
            from dplora.accounting import cache

            cache.put(choice_key, interval)
    key = (
        f"ceiling-v1/{version}/{event.sample_rate!r}/{event.noise_multiplier!r}/{event.steps}/"
        f"{event.adjacency.value}/{interval!r}/{','.join(map(repr, fprs))}"
    )
    tprs = _cached(key, fprs) if use_cache else None
    if tprs is None:
        tprs = computed(event, interval, tuple(fprs))
        if use_cache:
            from dplora.accounting import cache

            cache.put(key, list(tprs))
    return AttackCeiling(fprs=tuple(fprs), tprs=tprs, interval=interval, accountant_version=version)


@functools.lru_cache(maxsize=64)
def computed(event: DpSgdEvent, interval: float, fprs: tuple[float, ...]) -> tuple[float, ...]:
    """The ceilings at ``fprs``, computed (memoised in this process only: a pure function of its arguments)."""
    deltas = _profile(event, interval)
    return tuple(tradeoff_tpr(deltas, EPS_GRID, a) for a in fprs)


def _cached_interval(key: str, intervals: tuple[float, ...]) -> float | None:
    """A cached interval choice, validated (one of ``intervals``), or None."""
    from dplora.accounting import cache

    value = cache.load().get(key)
    return value if isinstance(value, float) and value in intervals else None


def _cached(key: str, fprs) -> tuple[float, ...] | None:
    """A cached ceiling, validated (one float in [α, 1] per α), or None."""
    from dplora.accounting import cache

    value = cache.load().get(key)
    if not isinstance(value, list) or len(value) != len(fprs):
        return None
    if not all(isinstance(t, float) and a <= t <= 1.0 for a, t in zip(fprs, value, strict=True)):
        return None
    return tuple(value)


# FPRs of the drawn trade-off curve: log-spaced 1e-4 .. 0.5, then linear to 0.99 (public constants)
CURVE_FPRS = tuple(float(a) for a in np.concatenate((np.logspace(-4, np.log10(0.5), 40), np.linspace(0.52, 0.99, 24))))


def tradeoff_curve(event: DpSgdEvent, fprs: tuple[float, ...] = CURVE_FPRS) -> AttackCeiling | None:
    """The f-DP trade-off curve of ``event`` for drawing (``budget --plot``): TPR ceiling at each α of ``fprs``.

    One privacy profile (the same PLD and interval choice as :func:`attack_ceiling`, computed; at q = 1 the exact
    Gaussian curve) read at every α; public q, σ, T and adjacency only.

    Returns:
        :class:`AttackCeiling` over ``fprs`` (TPRs non-decreasing in α, each in [α, 1]), or None when the PLD is
        past dplora's time limit.
    Raises:
        ValueError: an α outside (0, 1).
    """
    return attack_ceiling(event, tuple(fprs))


def ceiling_entry(event: DpSgdEvent, *, use_cache: bool = False) -> dict:
    """The release record's ``attack_ceiling`` entry for ``event`` (``{"available": false, ...}`` when not stated)."""
    try:
        ceiling = attack_ceiling(event, use_cache=use_cache)
    except (ValueError, ArithmeticError, MemoryError) as err:  # never fail a finished run over its ceiling
        return {"available": False, "reason": f"PLD failed numerically ({err.__class__.__name__})", "method": METHOD}
    if ceiling is None:
        return {
            "available": False,
            "reason": f"the PLD of this mechanism exceeds dplora's time limit ({PLD_MAX_SECONDS:g} s) at every "
            f"interval tried ({', '.join(map(str, CEILING_INTERVALS))})",
            "method": METHOD,
        }
    return {"available": True, **ceiling.to_dict()}


def ceiling_sentence(entry: dict, unit_words: str = "one unit's data was used") -> str:
    """The ceiling in plain words, from a record's ``attack_ceiling`` entry (the model card and ``budget``).

    Args:
        entry: :func:`ceiling_entry`'s dict (its optional ``holds_for`` names what it covers; default "this
            release alone").
        unit_words: what the test asks, e.g. ``"one customer's records were used"``.
    """
    if not entry.get("available"):
        return "attack ceiling: not stated (" + str(entry.get("reason", "not computed")) + ")"
    at = entry["true_positive_rate_at"]
    one = at.get("1%")
    others = ", ".join(f"{percent_up(v)} % at {k.replace('%', ' %')}" for k, v in at.items() if k != "1%")
    return (
        f"no test of whether {unit_words} can exceed {percent_up(one)} % true positives at 1 % false "
        f"positives ({others} false positives); this holds for {entry.get('holds_for') or 'this release alone'}"
    )


def same_ceiling(recorded: dict, recomputed: dict, tolerance: float = 1e-4, below: float = 1e-6) -> str | None:
    """None when two ``attack_ceiling`` entries agree, else what differs.

    A recorded TPR may sit up to ``tolerance`` above the recomputed one (another accountant build) but at most
    ``below`` under it (one step of the 6-decimal round-up, and an older record's round-to-nearest): a ceiling
    edited down is refused (lowering each TPR by 9e-5 would turn the card's 3.1 % into 3.0 %)."""
    if bool(recorded.get("available")) != bool(recomputed.get("available")):
        return f"recorded available={recorded.get('available')!r}, recomputed {recomputed.get('available')!r}"
    if not recomputed.get("available"):
        return None
    got, want = recorded.get("true_positive_rate_at"), recomputed["true_positive_rate_at"]
    if not isinstance(got, dict) or set(got) != set(want):
        return "the recorded false-positive rates are not " + ", ".join(want)
    for key, value in want.items():
        if not isinstance(got[key], (int, float)) or not (value - below * (1 + 1e-9) <= got[key] <= value + tolerance):
            return f"TPR at {key}: recorded {got[key]!r}, recomputed {value:.6f}"
    return None
