"""The built-in accountants, registered under the contract's :class:`~dplora.accounting.events.Accountant` values.

Each is a :class:`~dplora.accounting.registry.PrivacyAccountant` that calls one library through
:mod:`~dplora.accounting.backends` (ε), :mod:`~dplora.accounting.cost` (working range) and
:mod:`~dplora.accounting.composition` (several runs):

- ``prv``: Opacus ``PRVAccountant`` (Gopi et al. 2021), add/remove only; checked chain PRV → PLD → RDP.
- ``rdp``: Opacus RDP analysis (Mironov 2017; Mironov et al. 2019), add/remove only; no range, the floor.
- ``pld``: dp_accounting ``PLDAccountant`` (Doroshenko et al. 2022), add/remove and replace-one.

A new accountant is one more subclass registered with :func:`~dplora.accounting.registry.register` (here, or in
its own module imported by ``dplora/accounting/__init__.py``) and, to be offered in contracts, one
:class:`Accountant` member with its name.
"""

from __future__ import annotations

import dataclasses

from dplora.accounting import backends, composition, cost, registry
from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent


class _Opacus(registry.PrivacyAccountant):
    """Opacus's accountants: add/remove only (the refusal says to use PLD)."""

    package = "opacus"
    relations = frozenset({Adjacency.ADD_REMOVE})

    def unsupported_message(self) -> str:
        return backends.add_remove_only(self.name, self.adjacency)


@registry.register
class PrvAccountant(_Opacus):
    """Opacus's PRV accountant at ``eps_error`` (default 0.01), δ_err = δ/1000 (:func:`backends.prv_epsilon`)."""

    name = Accountant.PRV.value
    chain = (Accountant.PRV.value, Accountant.PLD.value)
    composition_method = composition.PRV

    def epsilons(self, event: DpSgdEvent, delta: float, steps: list[int], tolerance=None) -> list[float]:
        eps_error = cost.DEFAULT_EPS_ERROR if tolerance is None else tolerance.eps_error
        return [
            0.0 if t == 0 else backends.prv_epsilon(dataclasses.replace(event, steps=t), delta, eps_error)
            for t in steps
        ]

    def out_of_range(self, event: DpSgdEvent, delta: float, tolerance) -> str | None:
        return cost.prv_out_of_range(event, delta, tolerance)

    def compose(self, history: list[tuple[float, float, int]], delta: float) -> float:
        return composition.prv_composed(history, delta)


@registry.register
class RdpAccountant(_Opacus):
    """Opacus's RDP analysis over ``RDP_ORDERS`` (:func:`backends.rdp_epsilons`): analytic, so always in range."""

    name = Accountant.RDP.value
    chain = ()
    rtol = 1e-4
    refusal_hint = " RDP with orders up to 63 cannot certify ε below about 0.1 at δ=1e-5; use accountant: pld or prv"
    composition_method = composition.RDP

    def epsilons(self, event: DpSgdEvent, delta: float, steps: list[int], tolerance=None) -> list[float]:
        return backends.rdp_epsilons(event, delta, steps)

    def compose(self, history: list[tuple[float, float, int]], delta: float) -> float:
        return composition.rdp_composed(history, delta)


@registry.register
class PldAccountant(registry.PrivacyAccountant):
    """dp_accounting's PLD at ``value_discretization_interval`` (default 1e-4) (:func:`backends.pld_epsilons`)."""

    name = Accountant.PLD.value
    package = "dp-accounting"
    relations = frozenset({Adjacency.ADD_REMOVE, Adjacency.REPLACE_ONE})
    composition_method = composition.PLD

    def epsilons(self, event: DpSgdEvent, delta: float, steps: list[int], tolerance=None) -> list[float]:
        interval = cost.DEFAULT_PLD_INTERVAL if tolerance is None else tolerance.pld_interval
        return backends.pld_epsilons(event, delta, steps, interval)

    def out_of_range(self, event: DpSgdEvent, delta: float, tolerance) -> str | None:
        return cost.pld_out_of_range(event, delta, tolerance)

    def compose(self, history: list[tuple[float, float, int]], delta: float) -> float:
        return composition.pld_composed(history, delta, self.adjacency.value)
