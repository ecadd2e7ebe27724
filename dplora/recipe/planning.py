"""What a run of a contract will cost, before any data is read: the plan for a contract and why a private unit count
is refused. Used by ``dplora train``, ``dplora budget``, sweeps and audits.
"""

from __future__ import annotations

from dplora.accounting import Adjacency
from dplora.contract.spec import Contract
from dplora.data import units as data_mod
from dplora.errors import BadInputError
from dplora.plan.training import TrainingPlan, make_plan


def plan_for(
    contract: Contract, unit_index: data_mod.UnitIndex | None, *, release: bool = True, log=None
) -> TrainingPlan:
    """Plan with a public N: ``privacy.num_units`` if declared, else (where N is public) the data's count.

    N is private under add/remove adjacency: the neighbouring dataset has one unit more or less, so a counted N
    (and the q = B/N, T = ⌈E·N/B⌉ and σ that follow from it) would tell the neighbours apart. A run that writes a
    release (``release``) must then declare N as a public number; the data's count is only compared with it, as
    a local warning through ``log`` (refusing would make "release or no release" depend on one unit). Under
    replace-one adjacency N is public (neighbours hold the same number of units) unless ``data.eval_fraction``
    can move the replaced unit across the held-out split; then N must be declared too. ``release=False``
    (``dplora budget``, a local dry run) plans with the exact count and never refuses for want of a declared N.

    Args:
        contract: the validated contract.
        unit_index: the training side's units (None: no data read; N must be declared).
        release: the plan feeds a release (record, card, manifest): N must be public.
        log: one-line local message sink for the count check (never written into a release).
    Returns:
        :class:`dplora.plan.training.TrainingPlan`; ``num_units_source`` is ``"contract"`` or ``"data"`` (public count).
    Raises:
        BadInputError: N not declared where it is private, or not declared and no data given (exit 2).
        PlanRefusedError: see :func:`dplora.plan.training.make_plan`.
    """
    declared = contract.privacy.num_units
    if declared is not None:
        if unit_index is not None and unit_index.num_units > declared and log is not None:
            log(
                f"warning: the data holds more protected units than privacy.num_units={declared} (local check, "
                "not written into the release); q, T and σ use the declared N"
            )
        return make_plan(contract, num_units=declared, num_units_source="contract")
    if unit_index is None:
        raise BadInputError("privacy.num_units is not declared: the data is needed to count protected units")
    why = private_count_reason(contract)
    if why is not None and release:
        raise BadInputError(
            f"privacy.num_units: declare N as a public number ({why}; the data has about "
            f"{_rounded(unit_index.num_units)} units: do not copy the exact count if it is private, round it)"
        )
    return make_plan(contract, num_units=unit_index.num_units, num_units_source="data")


def private_count_reason(contract: Contract) -> str | None:
    """Why the data's count of units is private under ``contract`` (None: it is public).

    Add/remove: neighbouring datasets differ in N. Replace-one with ``data.eval_fraction``: the keyed split can
    put the replaced unit on the other side, so the training side's N differs by one.
    """
    privacy = contract.privacy
    if privacy.adjacency is Adjacency.ADD_REMOVE:
        return "under add_remove adjacency the counted N differs between neighbouring datasets"
    if contract.data.eval_fraction is not None:
        return "under replace_one, data.eval_fraction can move the replaced unit out of the training side"
    return None


def _rounded(n: int) -> int:
    """``n`` to two significant figures (a hint for the operator's error line, not a count to copy)."""
    digits = max(len(str(n)) - 2, 1)  # at least to tens: below 100 two figures would be the exact count
    return int(round(n, -digits))
