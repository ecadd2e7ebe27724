"""ε of a :class:`DpSgdEvent` under each accountant. Libraries only: Opacus (RDP, PRV), dp_accounting (PLD).

Opacus's RDP analysis is pure numpy/scipy. Importing it as ``opacus.accountants.analysis.rdp`` would run
``opacus/__init__`` and import torch (about 5 s), so when Opacus is not loaded yet the same file is loaded on
its own: ``dplora budget`` with RDP stays under 2 s.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
import sys
import warnings
from pathlib import Path

from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent
from dplora.errors import UnsupportedAccountingError

# Opacus RDPAccountant.DEFAULT_ALPHAS (orders up to 63); a test checks they stay equal.
RDP_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


class AccountingNumericalError(ArithmeticError):
    """An accountant failed numerically on this event (e.g. PRV on very short or very loose runs)."""


@functools.cache
def _opacus_rdp():
    if "opacus" in sys.modules:
        from opacus.accountants.analysis import rdp

        return rdp
    spec = importlib.util.find_spec("opacus")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("opacus is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "accountants" / "analysis" / "rdp.py"
    mod_spec = importlib.util.spec_from_file_location("_dplora_opacus_rdp_analysis", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def accountant_version(accountant: Accountant) -> str:
    """Library and version that computes ``accountant``, e.g. ``"opacus 1.6.0"``."""
    package = "dp-accounting" if Accountant(accountant) is Accountant.PLD else "opacus"
    return f"{package} {importlib.metadata.version(package)}"


def _require_add_remove(event: DpSgdEvent, accountant: Accountant) -> None:
    if event.adjacency is not Adjacency.ADD_REMOVE:
        raise UnsupportedAccountingError(
            f"accountant={accountant.value} supports only adjacency=add_remove (Opacus's accountants are "
            f"add/remove only); for adjacency={event.adjacency.value} use accountant: pld"
        )


def rdp_epsilons(event: DpSgdEvent, delta: float, steps: list[int]) -> list[float]:
    """RDP ε after each step count in ``steps`` (Opacus analysis; Mironov et al. 2019, conversion of Balle et al.).

    RDP of T compositions is T times the RDP of one step, so a whole curve costs one RDP evaluation.
    """
    _require_add_remove(event, Accountant.RDP)
    rdp_mod = _opacus_rdp()
    orders = list(RDP_ORDERS)
    one = rdp_mod.compute_rdp(q=event.sample_rate, noise_multiplier=event.noise_multiplier, steps=1, orders=orders)
    out = []
    with warnings.catch_warnings():
        # Opacus warns when the optimum is an end order; ε is still a valid upper bound, and the warning
        # would break the CLI's one-line stderr (e.g. `dplora budget` with an unreachable RDP target).
        warnings.filterwarnings("ignore", message="Optimal order is the", category=UserWarning)
        for t in steps:
            if t == 0:
                out.append(0.0)
                continue
            eps, _ = rdp_mod.get_privacy_spent(orders=orders, rdp=one * t, delta=delta)
            out.append(float(eps))
    return out


def prv_epsilon(event: DpSgdEvent, delta: float) -> float:
    """PRV upper bound on ε (Opacus ``PRVAccountant``, Gopi et al. 2021, eps_error 0.01)."""
    _require_add_remove(event, Accountant.PRV)
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = [(event.noise_multiplier, event.sample_rate, event.steps)]
    try:
        with warnings.catch_warnings():
            # Opacus's PRV sizes its domain with an RDPAccountant, which warns on end orders (see rdp_epsilons),
            # and takes log(1 - q) = log(0) at q = 1; neither changes ε, both would break the one-line stderr.
            warnings.filterwarnings("ignore", message="Optimal order is the", category=UserWarning)
            warnings.filterwarnings("ignore", message="divide by zero encountered in log", category=RuntimeWarning)
            eps = float(acc.get_epsilon(delta=delta))
    except (ValueError, RuntimeError, FloatingPointError, ZeroDivisionError) as err:
        raise AccountingNumericalError(f"PRV failed on this event: {err}") from err
    if not math.isfinite(eps):
        raise AccountingNumericalError("PRV returned a non-finite ε")
    return eps


def pld_epsilon(event: DpSgdEvent, delta: float) -> float:
    """PLD ε (dp_accounting ``PLDAccountant``, pessimistic discretisation 1e-4; Doroshenko et al. 2022)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    relation = {
        Adjacency.ADD_REMOVE: dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        Adjacency.REPLACE_ONE: dp_accounting.NeighboringRelation.REPLACE_ONE,
    }[event.adjacency]
    acc = pld_privacy_accountant.PLDAccountant(neighboring_relation=relation)
    acc.compose(event.to_dp_accounting())
    eps = float(acc.get_epsilon(delta))
    if math.isnan(eps):
        raise AccountingNumericalError("PLD returned NaN")
    return eps


def epsilons(event: DpSgdEvent, delta: float, accountant: Accountant, steps: list[int]) -> list[float]:
    """ε (≥ 0) after each step count in ``steps``, for ``event``'s q, σ and adjacency under ``accountant``.

    Raises:
        UnsupportedAccountingError: RDP or PRV asked for replace-one.
        AccountingNumericalError: the accountant failed numerically.
    """
    accountant = Accountant(accountant)
    if event.noise_multiplier == 0.0:
        return [0.0 if t == 0 else math.inf for t in steps]
    if accountant is Accountant.RDP:
        values = rdp_epsilons(event, delta, steps)
    else:
        fn = prv_epsilon if accountant is Accountant.PRV else pld_epsilon
        values = [0.0 if t == 0 else fn(_with_steps(event, t), delta) for t in steps]
    return [max(0.0, v) for v in values]  # never report a negative ε


def _with_steps(event: DpSgdEvent, steps: int) -> DpSgdEvent:
    return DpSgdEvent(
        sample_rate=event.sample_rate,
        noise_multiplier=event.noise_multiplier,
        steps=steps,
        adjacency=event.adjacency,
        sampler=event.sampler,
    )
