"""Composition of several DP-SGD runs on the same units: the total (ε, δ) of a hyperparameter sweep.

Basic composition (Dwork & Roth 2014, Thm 3.16) always holds: Σε, Σδ. When the runs' mechanisms are known, an
accountant composes them more tightly: RDP adds the runs' RDP curves (Mironov 2017, Prop. 1; Opacus
``RDPAccountant`` with every run's (σ, q, T) in its history), PRV and PLD compose the runs' privacy-loss
distributions (Opacus ``PRVAccountant``, Gopi et al. 2021; dp_accounting ``PLDAccountant``, Doroshenko et al.
2022). All are evaluated at the same total δ = Σδ, so each is a valid (ε, Σδ) bound and the smallest is stated.
"""

from __future__ import annotations

import math
from decimal import Decimal

from dplora.accounting import registry
from dplora.accounting.checked import FLOOR
from dplora.accounting.cost import Tolerance, out_of_range
from dplora.accounting.events import DpSgdEvent

BASIC = "basic composition: Σε, Σδ (Dwork & Roth 2014, The Algorithmic Foundations of DP, Thm 3.16)"
RDP = (
    "RDP composition: the trials' RDP curves added (Mironov 2017, Prop. 1), converted at the total δ "
    "(Opacus RDPAccountant with every trial's (σ, q, T) in its history)"
)
PRV = "PRV composition of every trial's (σ, q, T) (Gopi et al. 2021; Opacus PRVAccountant), at the total δ"
PLD = "PLD composition of every trial's event (Doroshenko et al. 2022; dp_accounting PLDAccountant), at the total δ"


def exact(x: float) -> Decimal:
    """The float as the exact decimal of its shortest repr (as the ledger stores it)."""
    return Decimal(repr(float(x)))


def compose(per_trial: list[dict], adjacency: str) -> dict:
    """Total (ε, δ) of all trials: basic composition, and accountant compositions where they apply.

    Args:
        per_trial: dicts with ``epsilon``, ``delta``, ``sample_rate``, ``noise_multiplier``, ``steps`` and
            ``accountant`` (the plan's) of each trial.
        adjacency: the trials' common neighbouring relation.

    Returns:
        ``{"total_epsilon", "total_delta", "composition", "compositions": {name: {...}}}``: the stated total is the
        smallest ε among the compositions computed, all at the same total δ = Σδ (each is a valid bound, so the
        minimum is). Compositions out of the accountant's range are listed with the reason and skipped.
    """
    total_delta = sum((exact(t["delta"]) for t in per_trial), Decimal(0))
    basic = sum((exact(t["epsilon"]) for t in per_trial), Decimal(0))
    delta = float(total_delta)
    out = {"basic": {"epsilon": float(basic), "epsilon_exact": str(basic), "method": BASIC}}
    history = [(t["noise_multiplier"], t["sample_rate"], t["steps"]) for t in per_trial]
    accountants = {t["accountant"] for t in per_trial}
    for name in composers(accountants, adjacency):
        account = registry.make(name, adjacency)
        reason = out_of_range_reason(name, history, delta, adjacency)
        out[name] = _guarded(account.composition_method, lambda a=account: a.compose(history, delta), reason)
    best = min((k for k in out if "epsilon" in out[k]), key=lambda k: out[k]["epsilon"])
    computed = ", ".join(f"{k} {v['epsilon']:.4f}" for k, v in out.items() if "epsilon" in v)
    return {
        "total_epsilon": out[best]["epsilon"],
        "total_delta": delta,
        "total_delta_exact": str(total_delta),
        "composition": f"{out[best]['method']}; the smallest of the bounds computed ({computed})",
        "compositions": out,
    }


def composers(accountants: set[str], adjacency: str) -> list[str]:
    """Registry names of the accountants that compose trials run under ``accountants`` at ``adjacency``.

    The floor accountant (RDP, :data:`~dplora.accounting.checked.FLOOR`: its bound holds for any add/remove trial,
    whatever accountant planned it) first wherever it applies, then every other registered accountant that
    composes runs, supports the relation and planned every trial, in registry order.
    """
    out = []
    for name in (FLOOR.value, *(n for n in registry.names() if n != FLOOR.value)):
        account = registry.make(name, adjacency)
        if account.composition_method is None or account.adjacency not in account.relations:
            continue
        if name == FLOOR.value or accountants == {name}:
            out.append(name)
    return out


def _guarded(method: str, compute, reason: str | None = None) -> dict:
    if reason is not None:
        return {"method": method, "skipped": reason}
    try:
        eps = float(compute())
    except (ArithmeticError, ValueError, RuntimeError, MemoryError) as err:
        return {"method": method, "skipped": f"failed numerically: {err.__class__.__name__}"}
    if not math.isfinite(eps):
        return {"method": method, "skipped": "not finite"}
    return {"method": method, "epsilon": eps}


def out_of_range_reason(accountant: str, history, delta: float, adjacency: str = "add_remove") -> str | None:
    """Why the accountant must not compose these trials (each trial's event over all steps bounds the cost)."""
    total = sum(t for _, _, t in history)
    for sigma, q, _ in history:
        event = DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=total, adjacency=adjacency)
        if (reason := out_of_range(accountant, event, delta, Tolerance())) is not None:
            return reason
    return None


def rdp_composed(history: list[tuple[float, float, int]], delta: float) -> float:
    """ε at ``delta`` of the runs' (σ, q, T) composed by Opacus's ``RDPAccountant`` (add/remove)."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = list(history)
    return accountant.get_epsilon(delta=delta)


def prv_composed(history: list[tuple[float, float, int]], delta: float) -> float:
    """ε at ``delta`` of the runs' (σ, q, T) composed by Opacus's ``PRVAccountant`` (add/remove)."""
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()
    accountant.history = list(history)
    return accountant.get_epsilon(delta=delta)


def pld_composed(history: list[tuple[float, float, int]], delta: float, adjacency: str) -> float:
    """ε at ``delta`` of the runs' (σ, q, T) composed by dp_accounting's ``PLDAccountant`` under ``adjacency``."""
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    relation = (
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
        if adjacency == "add_remove"
        else dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    accountant = PLDAccountant(neighboring_relation=relation)
    for sigma, q, steps in history:
        accountant.compose(
            DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps, adjacency=adjacency).to_dp_accounting()
        )
    return accountant.get_epsilon(delta)


MECHANISMS = ("dp_sgd", "gaussian", "laplace")
# a DP count (gaussian/laplace event) below this noise has no range check of its own and its PLD grows without bound
# (measured: 8 s at σ 0.2, 19 s at 0.1, minutes at 0.01): its ε and ceiling are not stated
MIN_COUNT_NOISE = 0.5


def has_noiseless_charge(events: list[dict]) -> bool:
    """True when an event has noise_multiplier ≤ 0: no finite ε, and a membership test may reach TPR 1."""
    return any(float(e.get("noise_multiplier", 1.0)) <= 0.0 for e in events)


def count_noise_reason(events: list[dict]) -> str | None:
    """Why a list of ledger events cannot be composed in bounded time, or None.

    A ``gaussian``/``laplace`` event with 0 < noise_multiplier < :data:`MIN_COUNT_NOISE` is refused here (a noise-0
    event is handled by the callers: no finite ε, ceiling TPR 1)."""
    for e in events:
        sigma = float(e.get("noise_multiplier", 1.0))
        if e["mechanism"] != "dp_sgd" and 0.0 < sigma < MIN_COUNT_NOISE:
            return (
                f"a {e['mechanism']} count with noise_multiplier {sigma:g} < {MIN_COUNT_NOISE}: its privacy loss "
                "distribution is too large to compose in bounded time"
            )
    return None


def validate_events(events: list, adjacency: str) -> list[dict]:
    """Check a ledger charge's events: each a dict naming a known ``mechanism`` with valid numbers.

    ``dp_sgd``: ``sample_rate`` q ∈ (0, 1], ``noise_multiplier`` σ ≥ 0, integer ``steps`` T ≥ 0, ``adjacency``
    (must equal the charge's) and ``accountant``. ``gaussian`` / ``laplace`` (a DP count): ``noise_multiplier``
    = noise std (Gaussian) or scale b (Laplace) divided by the query's sensitivity under the adjacency.

    Raises:
        ValueError: a malformed event (the message names it).
    """
    out = []
    for event in events:
        if not isinstance(event, dict) or event.get("mechanism") not in MECHANISMS:
            raise ValueError(f"each event must be a dict with mechanism in {MECHANISMS}, got {event!r}")
        if event["mechanism"] == "dp_sgd":
            if event.get("adjacency") != adjacency:
                raise ValueError(f"a dp_sgd event of adjacency {event.get('adjacency')!r} in a {adjacency} charge")
            try:
                DpSgdEvent.from_dict(event)
            except (KeyError, TypeError) as err:
                raise ValueError(f"a dp_sgd event needs sample_rate, noise_multiplier and steps ({err!r})") from None
        else:
            sigma = event.get("noise_multiplier")
            if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not math.isfinite(sigma) or sigma < 0:
                raise ValueError(f"a {event['mechanism']} event needs a finite noise_multiplier >= 0, got {sigma!r}")
        out.append(dict(event))
    return out


def dp_event_of(event: dict):
    import dp_accounting

    if event["mechanism"] == "dp_sgd":
        return DpSgdEvent.from_dict(event).to_dp_accounting()
    if event["mechanism"] == "gaussian":
        return dp_accounting.GaussianDpEvent(event["noise_multiplier"])
    return dp_accounting.LaplaceDpEvent(event["noise_multiplier"])


def compose_events(events: list[dict], delta: float, adjacency: str) -> dict:
    """ε at ``delta`` of all ``events`` composed: dp_accounting PLD, and Opacus RDP under add/remove (DP-SGD only).

    Returns:
        ``{name: {"method", "epsilon"} or {"method", "skipped"}}`` for ``pld`` and (add/remove, DP-SGD only)
        ``rdp``; each computed value is a valid ε at ``delta`` for the composition.
    """
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    out = {}
    sgd = [e for e in events if e["mechanism"] == "dp_sgd"]
    history = [(float(e["noise_multiplier"]), e["sample_rate"], e["steps"]) for e in sgd]
    relation = (
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
        if adjacency == "add_remove"
        else dp_accounting.NeighboringRelation.REPLACE_ONE
    )

    def pld() -> float:
        accountant = PLDAccountant(neighboring_relation=relation)
        for event in events:
            accountant.compose(dp_event_of(event))
        return accountant.get_epsilon(delta)

    laplace_replace = adjacency != "add_remove" and any(e["mechanism"] == "laplace" for e in events)
    reason = "dp_accounting's PLD has no Laplace event under replace-one" if laplace_replace else None
    # a charge without noise has no finite ε; dp_accounting's range check raises on σ = 0
    noiseless = has_noiseless_charge(events)
    reason = "a charge without noise (noise_multiplier 0): no finite ε" if noiseless else reason
    reason = reason or count_noise_reason(events)
    out["pld"] = _guarded(
        PLD, pld, reason or (out_of_range_reason("pld", history, delta, adjacency) if history else None)
    )
    if adjacency == "add_remove" and len(sgd) == len(events):
        out["rdp"] = _guarded(RDP, lambda: rdp_composed(history, delta), reason if noiseless else None)
    return out


SHORT = {"pld": "PLD", "rdp": "RDP"}


def ledger_total(items: list[tuple[Decimal, Decimal, list | None]], adjacency: str) -> dict:
    """A ledger population's total at the same δ = Σδ: basic composition, and the stored events composed.

    Args:
        items: each charge's (ε, δ, events or None). Charges without events (schema-1 charges, non-private
            runs) are added by basic composition to the composed total of the others.
        adjacency: the population's.

    Returns:
        ``{"basic": {"epsilon", "delta"} (exact strings), "composed": {"epsilon", "delta", "method",
        "method_short"} or None (nothing to compose) or {"epsilon": None, "skipped"}, "epsilon": the tighter
        valid ε (float)}``.
    """
    eps = sum((e for e, _, _ in items), Decimal(0))
    dlt = sum((d for _, d, _ in items), Decimal(0))
    out = {"basic": {"epsilon": str(eps), "delta": str(dlt), "method": BASIC}, "composed": None, "epsilon": float(eps)}
    with_events = [(e, d, ev) for e, d, ev in items if ev]
    if not with_events or not eps.is_finite():
        return out
    rest = sum((e for e, _, ev in items if not ev), Decimal(0))
    part_delta = float(sum((d for _, d, _ in with_events), Decimal(0)))
    events = [x for _, _, ev in with_events for x in ev]
    options = compose_events(events, part_delta, adjacency)
    done = {k: v for k, v in options.items() if "epsilon" in v}
    if not done:
        skipped = "; ".join(f"{k}: {v['skipped']}" for k, v in options.items())
        out["composed"] = {"epsilon": None, "delta": str(dlt), "skipped": skipped}
        return out
    best = min(done, key=lambda k: done[k]["epsilon"])
    value = done[best]["epsilon"] + float(rest)
    label = SHORT[best] + (" + basic for charges without events" if rest else "")
    out["composed"] = {"epsilon": value, "delta": str(dlt), "method": done[best]["method"], "method_short": label}
    out["epsilon"] = min(float(eps), value)
    return out
