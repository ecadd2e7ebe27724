"""Attack ceilings of several mechanisms composed: every charge on a ledger population, and a release with the
audit run attached to it (:func:`composed_ceiling`, :func:`runs_ceiling_entry`).

Public inputs only (each mechanism's q, σ, T, adjacency or a DP count's noise); the single-mechanism ceiling, its
grid and its words are :mod:`dplora.accounting.ceiling`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dplora.accounting.ceiling import (
    CEILING_FPRS,
    CEILING_INTERVALS,
    EPS_GRID,
    GAUSSIAN_METHOD,
    METHOD,
    AttackCeiling,
    ceiling_entry,
    fpr_label,
    gaussian_tprs,
    profile_deltas,
    round_up,
    tradeoff_tpr,
)
from dplora.accounting.events import DpSgdEvent


def composed_ceiling(events: list[dict], adjacency: str, fprs: tuple[float, ...] = CEILING_FPRS) -> dict:
    """The attack ceiling of several mechanisms on the same units composed (a population's charges in the ledger).

    The events (``dp_sgd``, ``gaussian`` or ``laplace`` dicts, as the ledger stores them:
    :func:`dplora.accounting.composition.validate_events`) are composed by dp_accounting's ``PLDAccountant``
    (interval 1e-4, pessimistic) and the trade-off formula of this module is applied to the composed profile. The
    composition is called only inside dplora's PLD range (:func:`dplora.accounting.composition.out_of_range_reason`).

    Returns:
        ``{"available": True, "true_positive_rate_at": {...}, "method", "accountant_version", "scope"}`` or
        ``{"available": False, "reason"}`` (also for a count event with 0 < noise_multiplier <
        :data:`dplora.accounting.composition.MIN_COUNT_NOISE` and for a composition that fails numerically); a
        charge without noise gives TPR 1.0 at every FPR. Never raises on events that ``validate_events`` accepts.
    """
    from dplora.accounting.backends import accountant_version
    from dplora.accounting.composition import count_noise_reason, has_noiseless_charge
    from dplora.accounting.events import Accountant

    if not events:
        return {"available": False, "reason": "no events to compose"}
    if has_noiseless_charge(events):
        # dp_accounting composes a noise-0 event by flagging the accountant and leaving its PLD as it was, so
        # reading the PLD would drop the charge: without noise a test can reach TPR 1
        return {
            "available": True,
            "true_positive_rate_at": {fpr_label(a): 1.0 for a in fprs},
            "method": "a charge without noise (noise_multiplier 0): no test is bounded below true-positive rate 1",
            "accountant_version": accountant_version(Accountant.PLD),
            "scope": "every charge on this population together",
        }
    if (why := count_noise_reason(events)) is not None:
        return {"available": False, "reason": why}
    try:
        return _composed_ceiling(events, adjacency, fprs)
    except (ArithmeticError, ValueError, MemoryError) as err:  # e.g. σ 1e-300 overflows the cost model
        return {"available": False, "reason": f"failed numerically: {type(err).__name__}"}


def _composed_ceiling(events: list[dict], adjacency: str, fprs: tuple[float, ...]) -> dict:
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    from dplora.accounting.backends import accountant_version
    from dplora.accounting.composition import dp_event_of, out_of_range_reason
    from dplora.accounting.cost import PLD_MIN_DELTA
    from dplora.accounting.events import Accountant

    sgd = [e for e in events if e["mechanism"] == "dp_sgd"]
    history = [(float(e["noise_multiplier"]), e["sample_rate"], e["steps"]) for e in sgd]
    if history and (why := out_of_range_reason("pld", history, PLD_MIN_DELTA, adjacency)) is not None:
        return {"available": False, "reason": why}
    if adjacency != "add_remove" and any(e["mechanism"] == "laplace" for e in events):
        return {"available": False, "reason": "dp_accounting's PLD has no Laplace event under replace-one"}
    relation = (
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
        if adjacency == "add_remove"
        else dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    accountant = PLDAccountant(neighboring_relation=relation, value_discretization_interval=CEILING_INTERVALS[0])
    with np.errstate(all="ignore"):
        for event in events:
            accountant.compose(dp_event_of(event))
        deltas = profile_deltas(accountant._pld, EPS_GRID)  # noqa: SLF001
    return {
        "available": True,
        "true_positive_rate_at": {fpr_label(a): round_up(tradeoff_tpr(deltas, EPS_GRID, a)) for a in fprs},
        "method": METHOD.replace("of the T-step mechanism", "of all the population's charges composed"),
        "accountant_version": accountant_version(Accountant.PLD),
        "scope": "every charge on this population together",
    }


AUDIT_SCOPE = (
    "this release and the audit run attached to it together (two DP runs on the same units, both in the signed "
    "record); more releases on the same population compose further"
)
AUDIT_HOLDS_FOR = "this release and its attached audit run together"


def runs_ceiling_entry(events: list[DpSgdEvent], *, scope: str = AUDIT_SCOPE, holds_for: str = AUDIT_HOLDS_FOR) -> dict:
    """The attack ceiling of several DP-SGD runs on the same units together (a release and its attached audit, or
    every trial of a ``dplora sweep`` whose choice the release publishes).

    Public inputs only: each run's q, σ, T and adjacency. Runs with the same q, σ and adjacency are one mechanism of
    ΣT steps (:func:`ceiling_entry`, so at q = 1 the exact Gaussian curve with μ = s·√(ΣT)/σ, and otherwise the
    same time-bounded PLD as a release's). All at q = 1 with different σ: μ = s·√(Σ T_i/σ_i²) (exact, Dong, Roth &
    Su 2022, Cor. 3.3). Otherwise dp_accounting's PLD of the runs composed (:func:`composed_ceiling`), inside
    dplora's PLD range.

    Args:
        events: one :class:`DpSgdEvent` per run (at least one; the same adjacency).
        scope, holds_for: what the ceiling covers, as data and in the words of
            :func:`dplora.accounting.ceiling.ceiling_sentence` (default: a release and its attached audit).
    Returns:
        A ``ceiling_entry``-style dict with ``scope`` and ``holds_for``, or ``{"available": False, "reason", ...}``.
    Raises:
        ValueError: no runs, or adjacencies differ.
    """
    from dplora.accounting.backends import accountant_version
    from dplora.accounting.events import Accountant

    if not events or len({e.adjacency for e in events}) != 1:
        raise ValueError("expected at least one run, all under the same adjacency")
    first = events[0]
    scope = {"scope": scope, "holds_for": holds_for}
    if len({(e.sample_rate, e.noise_multiplier) for e in events}) == 1:
        steps = sum(e.steps for e in events)
        return {**ceiling_entry(dataclasses.replace(first, steps=steps), use_cache=False), **scope}
    if all(e.sample_rate == 1.0 and e.noise_multiplier > 0 for e in events):
        # μ² adds under composition; one Gaussian run of σ' = 1/√(Σ T_i/σ_i²) and T = 1 has that μ
        sigma = 1.0 / math.sqrt(sum(e.steps / e.noise_multiplier**2 for e in events))
        one = dataclasses.replace(first, noise_multiplier=sigma, steps=1)
        tprs = gaussian_tprs(one, CEILING_FPRS)
        version = accountant_version(Accountant.PLD)
        ceiling = AttackCeiling(
            fprs=CEILING_FPRS, tprs=tprs, interval=0.0, accountant_version=version, method=GAUSSIAN_METHOD
        )
        return {"available": True, **ceiling.to_dict(), **scope}
    dicts = [e.to_dict() for e in events]
    return {**composed_ceiling(dicts, first.adjacency.value), **scope}
