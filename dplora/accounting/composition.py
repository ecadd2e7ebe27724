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
    if adjacency == "add_remove":
        out["rdp"] = _guarded(RDP, lambda: _opacus_epsilon("rdp", history, delta))
        if accountants == {"prv"}:
            out["prv"] = _guarded(PRV, lambda: _opacus_epsilon("prv", history, delta), _range("prv", history, delta))
    if accountants == {"pld"}:
        reason = _range("pld", history, delta, adjacency)
        out["pld"] = _guarded(PLD, lambda: _pld_epsilon(history, delta, adjacency), reason)
    best = min((k for k in out if "epsilon" in out[k]), key=lambda k: out[k]["epsilon"])
    computed = ", ".join(f"{k} {v['epsilon']:.4f}" for k, v in out.items() if "epsilon" in v)
    return {
        "total_epsilon": out[best]["epsilon"],
        "total_delta": delta,
        "total_delta_exact": str(total_delta),
        "composition": f"{out[best]['method']}; the smallest of the bounds computed ({computed})",
        "compositions": out,
    }


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


def _range(accountant: str, history, delta: float, adjacency: str = "add_remove") -> str | None:
    """Why the accountant must not compose these trials (each trial's event over all steps bounds the cost)."""
    from dplora.accounting import Accountant, DpSgdEvent
    from dplora.accounting.cost import Tolerance, out_of_range

    total = sum(t for _, _, t in history)
    for sigma, q, _ in history:
        event = DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=total, adjacency=adjacency)
        if (reason := out_of_range(Accountant(accountant), event, delta, Tolerance())) is not None:
            return reason
    return None


def _opacus_epsilon(name: str, history, delta: float) -> float:
    from opacus.accountants import PRVAccountant, RDPAccountant

    accountant = RDPAccountant() if name == "rdp" else PRVAccountant()
    accountant.history = list(history)
    return accountant.get_epsilon(delta=delta)


def _pld_epsilon(history, delta: float, adjacency: str) -> float:
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    from dplora.accounting import DpSgdEvent

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
