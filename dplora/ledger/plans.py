"""The ledger pre-check of planned runs: do they fit their population's cap, unit, unit key and adjacency?

Run before any private data is touched: by ``dplora train`` (one plan), ``dplora budget`` (a dry run: one plan, no
ledger is created) and ``dplora sweep`` (every trial together). The planned (ε, δ) of several plans are summed
exactly (basic composition, Dwork & Roth 2014, Thm 3.16); their events go along, so that the ledger also composes
them with what is spent (:meth:`dplora.ledger.store.Ledger.check`).
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from dplora.accounting.composition import exact
from dplora.contract.spec import PrivacySection
from dplora.ledger.store import Ledger
from dplora.plan.training import TrainingPlan, ledger_event


def check_plans(ledger: Ledger, privacy: PrivacySection, plans: Sequence[TrainingPlan]) -> None:
    """Refuse ``plans`` if together they do not fit ``privacy.population`` in ``ledger``; write nothing.

    Args:
        ledger: an open ledger.
        privacy: the contract's privacy section (``population`` set, ``protected_unit``, ``unit_key``).
        plans: one or more plans; ε (unitless) and δ (a probability) are summed as exact decimals of their
            shortest repr (:func:`dplora.accounting.composition.exact`); the adjacency is the first plan's (a
            sweep's trials share it); each plan's DP-SGD event (:func:`dplora.plan.training.ledger_event`) is passed.

    Raises:
        PlanRefusedError: no cap, another unit, unit key or adjacency, or spent + planned over the cap (exit 2).
        BadInputError: a bad population name or value.
    """
    ledger.check(
        privacy.population,
        epsilon=sum((exact(p.epsilon) for p in plans), Decimal(0)),
        delta=sum((exact(p.delta) for p in plans), Decimal(0)),
        protected_unit=privacy.protected_unit.value,
        adjacency=plans[0].adjacency.value,
        events=[ledger_event(p) for p in plans],
        unit_key=privacy.unit_key,
    )
