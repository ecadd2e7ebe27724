"""The plan for a contract, before any model is loaded: ``auto`` settings resolved by the planner, the public N,
and why a private unit count is refused. Used by ``dplora train``, ``dplora budget``, sweeps and audits.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from dplora.accounting.events import Adjacency
from dplora.contract.spec import MAX_LR, MAX_REFERENCE_LR, PLANNER_TOP_BATCH, Contract
from dplora.errors import BadInputError
from dplora.plan.training import TrainingPlan, control_plan, make_plan


class CountedUnits(Protocol):
    """What planning reads of the data: the count of protected units on the training side (private unless the
    contract makes it public; see :func:`private_count_reason`). A :class:`dplora.data.units.UnitIndex` is one."""

    num_units: int


def plan_for(contract: Contract, unit_index: CountedUnits | None, *, release: bool = True, log=None) -> TrainingPlan:
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
        held = None if unit_index is None or log is None else unit_index.num_units
        if held is not None and held > declared:
            log(
                f"warning: the data holds more protected units than privacy.num_units={declared} (local check, "
                "not written into the release); q, T and σ use the declared N"
            )
        elif held is not None and 2 * held < declared:
            log(
                f"warning: the data holds fewer than half of privacy.num_units={declared} protected units (local "
                "check, not written into the release): the logical batches will be far smaller than "
                "training.expected_batch_size, since q = B/N uses the declared N; declare a public N for this "
                "data (rounded, never the data's exact count where that count is private)"
            )
        return make_plan(contract, num_units=declared, num_units_source="contract")
    if unit_index is None:
        raise BadInputError("privacy.num_units is not declared: the data is needed to count protected units")
    why = private_count_reason(contract)
    if why is not None and release:
        if log is not None:  # a private count: the operator's terminal only, never the error line (exit 2 is public)
            log(f"the data has about {_rounded(unit_index.num_units)} protected units")
        raise BadInputError(
            f"privacy.num_units: declare N as a public number ({why}; do not copy the data's exact count if it is "
            "private: round it, or take it from a public source; dplora budget shows it on a terminal)"
        )
    return make_plan(contract, num_units=unit_index.num_units, num_units_source="data")


def resolve_auto(
    contract: Contract,
    *,
    epochs: float | None = None,
    max_steps: int | None = None,
    force: bool = False,
    max_epochs: float | None = None,
):
    """Resolve ``training.expected_batch_size: auto`` (and ``steps: auto``) with the planner; else unchanged.

    Public inputs only (:mod:`dplora.plan.planner`): the declared ``privacy.num_units``, ε, δ, the accountant,
    ``training.epochs`` (default 3) and an integer ``training.steps`` as a cap on T, ``training.lr`` as the rate
    at B = 32 (``auto``: the rate of the declared ``data.task``, :func:`dplora.plan.planner.reference_lr`). The
    data file is not opened. The resolved contract has B, T, lr and (if not given) the schedule and warmup filled
    in; ``contract.yaml`` of a release is that resolved contract.

    Args:
        contract: the validated contract.
        epochs, max_steps: ``dplora budget --recommend`` options, which take precedence over the contract's.
        force: plan with the planner even when the contract gives B and T (``--recommend``).
        max_epochs: a cap for ``training.epochs: auto`` that takes precedence over ``training.max_epochs``
            (``budget --time-budget``).

    Returns:
        ``(contract, recommendation)``; the recommendation is None when nothing was ``auto`` and no option given.

    Raises:
        BadInputError: ``auto`` without a declared ``privacy.num_units`` (a counted N would be private).
        PlanRefusedError: no candidate is eligible (:func:`dplora.plan.planner.recommend`).
    """
    from dplora.plan.planner import recommend, reference_lr

    training = contract.training
    if not training.is_auto and not force:
        return contract, None
    n = contract.privacy.num_units
    if n is None:
        raise BadInputError(
            "training.expected_batch_size: auto (the planner) needs privacy.num_units: a declared public N; "
            "the planner never counts the data"
        )
    if epochs is None and training.is_auto:
        epochs = None if training.epochs == "auto" else training.epochs
        max_epochs = max_epochs or training.max_epochs
    if max_steps is None and training.is_auto and isinstance(training.steps, int):
        max_steps = training.steps
    if training.lr == "auto":  # the task rule: a public constant of the declared data.task
        lr_ref, lr_source = reference_lr(contract.data.task), f"data.task={contract.data.task}"
    else:
        lr_ref = training.lr
        lr_source = "training.lr" if "lr" in training.model_fields_set else "training.lr (absent: the default)"
    if lr_ref > MAX_REFERENCE_LR:  # a fixed-B contract under --recommend: the planner reads lr as the rate at B = 32
        raise BadInputError(
            f"training.lr={lr_ref!r}: the planner reads it as the rate at B = 32 and scales it by sqrt(B/32) up to "
            f"B = {PLANNER_TOP_BATCH}: at most {MAX_REFERENCE_LR:g}, so the rate run is ≤ {MAX_LR}"
        )
    rec = recommend(
        num_units=n,
        target_epsilon=contract.privacy.target_epsilon,
        delta=contract.privacy.delta,
        accountant=contract.privacy.accountant,
        adjacency=contract.privacy.adjacency,
        lr_ref=lr_ref,
        epochs=epochs,
        max_steps=max_steps,
        max_epochs=max_epochs,
        lr_ref_source=lr_source,
    )
    return _apply_recommendation(contract, rec)


def _apply_recommendation(contract: Contract, rec):
    """``contract`` with the planner's B, T and lr (and its schedule and warmup unless the contract gives them);
    the recommendation says where the schedule came from. Returns (resolved contract, recommendation)."""
    training, choice = contract.training, rec.choice
    update = {
        "expected_batch_size": choice.expected_batch_size,
        "steps": choice.steps,
        "epochs": None,
        "max_epochs": None,
        "lr": choice.lr,
        "lr_schedule": training.lr_schedule or rec.lr_schedule,
        "warmup_steps": rec.warmup_steps if training.warmup_steps is None else training.warmup_steps,
    }
    resolved = type(training).model_validate(training.model_dump() | update)
    if training.lr_schedule is not None or training.warmup_steps is not None:  # the record states what runs
        schedule = resolved.lr_schedule
        rec = dataclasses.replace(
            rec,
            lr_schedule=str(getattr(schedule, "value", schedule)),
            warmup_steps=resolved.warmup_steps,
            schedule_source="contract",
        )
    return type(contract).model_validate(contract.model_dump() | {"training": resolved.model_dump()}), rec


def plan_with_planner(contract: Contract, unit_index, *, release: bool = True, log=None):
    """:func:`resolve_auto`, then :func:`plan_for` on the resolved contract; the plan carries the planner's table.

    Returns:
        ``(resolved contract, plan)``.
    """
    import dataclasses

    resolved, rec = resolve_auto(contract)
    plan = plan_for(resolved, unit_index, release=release, log=log)
    if rec is not None:
        plan = dataclasses.replace(plan, planner=rec.to_dict())
    return resolved, plan


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


def is_control(privacy) -> bool:
    """True for the privacy section of a non-private control contract (``privacy.enabled: false``): a planning
    question. Below planning the compiled switch is ``RunConfig.private`` (the mechanism's ``private``)."""
    return not privacy.enabled


def plan_for_run(contract: Contract, unit_index: CountedUnits, *, recommendation=None, log=None) -> TrainingPlan:
    """The plan a training run executes: :func:`plan_for` (public N), with the planner's table when ``auto`` was
    resolved (``recommendation``), and for a non-private control its DP twin's N, q and T with σ = 0 and ε = ∞
    (:func:`dplora.plan.training.control_plan`).

    Raises:
        BadInputError, PlanRefusedError: see :func:`plan_for`.
    """
    plan = plan_for(contract, unit_index, log=log)
    if recommendation is not None:
        plan = dataclasses.replace(plan, planner=recommendation.to_dict())
    return control_plan(plan) if is_control(contract.privacy) else plan
