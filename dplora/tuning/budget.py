"""``dplora budget``: the dry run. Plans q, T and σ, reports ε, and loads no model (no torch for RDP)."""

from __future__ import annotations

import math
from pathlib import Path

from dplora.contract.loader import load_contract
from dplora.contract.spec import Contract
from dplora.errors import BadInputError, PlanRefusedError
from dplora.plan.estimate import estimate_doc, parse_duration
from dplora.plan.training import TrainingPlan
from dplora.release.record import unit_statement

SWEEP_BATCH_FACTORS = (0.5, 1, 2, 4)
# Same label as metrics.jsonl: statistics computed on private data, outside the DP guarantee.
PRIVATE_STATS_NOTE = "computed on private data and not covered by DP (ε); for the operator only, never released"
SWEEP_EPOCH_FACTORS = (0.5, 1, 2)


def _eps_at_fraction(plan: TrainingPlan, frac: float) -> dict:
    step = max(1, math.ceil(plan.steps * frac)) if plan.steps else 0
    return {"step": step, "epsilon": plan.epsilon_at(step)}


def budget_report(
    config: Path | Contract,
    overrides: list[str],
    *,
    ledger_path: Path | None = None,
    sweep: bool = False,
    world_size: int = 1,
    recommend: bool = False,
    epochs: float | None = None,
    max_steps: int | None = None,
    show_private: bool = True,
    estimate: bool = False,
    time_budget: str | None = None,
    log=None,
) -> dict:
    """Plan a run and describe it as one JSON-ready dict.

    ``show_private`` False (the CLI under CI, without a terminal or with ``--json``, see
    :func:`dplora.surface.echo_private`) keeps the report public: no records-per-unit statistics, no local
    data-count warnings, and a counted N where N is private (undeclared under add/remove) is refused, not shown.

    ``world_size`` is W, the processes a multi-process run (torchrun / accelerate launch) would use: the report's
    ``units_per_rank`` gives the expected units each rank samples per logical step (q·⌊N/W⌋ to q·⌈N/W⌉; the plan,
    q, σ and ε do not depend on W).

    Returns:
        Keys include num_units, sample_rate, steps, noise_multiplier, epsilon, delta, accountant, adjacency,
        accountant_version, epsilon_at (25/50/75 % of T), and ``not_covered_by_dp.unit_stats`` (records per
        unit, computed on private data: not covered by DP). The data is read, as ``train`` reads it, except
        with ``recommend``: the planner (:func:`dplora.plan.resolve.resolve_auto`) chooses B, T and lr from
        public inputs only (declared N, ε, δ, ``epochs`` or ``max_steps``) and the data file is never opened; the
        report then has ``recommendation`` (the choice and every candidate weighed).

    ``time_budget`` (``--time-budget 45m``): an operator tool. The model is loaded and one synthetic step timed
    (:func:`dplora.plan.estimate.epochs_for_time`, no data) before the data is read; the epochs that fit are in
    ``time_budget.epochs`` and, with ``recommend`` or an ``auto`` contract, are the planner's E (its E cap under
    ``epochs: auto``). The plan never changes after the data is read and no run stops on a clock.

    Raises:
        BadInputError, PlanRefusedError: bad contract, data or plan (exit 2), as ``train`` refuses them; a counted
            private N without ``show_private``; a time budget without a unit, ≤ 0 or without a declared N.
    """
    from dplora.data.units import count_units
    from dplora.plan.resolve import plan_for, private_count_reason, resolve_auto

    if epochs is not None and max_steps is not None:
        raise BadInputError("--epochs and --max-steps: give at most one compute budget")
    if (epochs is not None or max_steps is not None) and not recommend:
        raise BadInputError("--epochs and --max-steps are compute budgets for --recommend")
    budget_seconds = None if time_budget is None else parse_duration(time_budget)
    contract = config if isinstance(config, Contract) else load_contract(config, overrides)
    if recommend and contract.privacy.num_units is None:
        raise BadInputError("--recommend needs privacy.num_units: a declared public N (the planner never counts data)")
    time_doc = None
    max_epochs = None
    if budget_seconds is not None:
        if contract.privacy.num_units is None:
            raise BadInputError("--time-budget needs privacy.num_units: a declared public N (it never counts data)")
        time_doc = _time_budget(contract, budget_seconds, recommend=recommend, max_steps=max_steps, log=log)
        if recommend or contract.training.is_auto:
            if contract.training.epochs == "auto" and epochs is None:
                max_epochs = max(1.0, time_doc["epochs"])  # the cap of epochs: auto (at least one pass)
            else:
                epochs = time_doc["epochs"]
    contract, rec = resolve_auto(contract, epochs=epochs, max_steps=max_steps, force=recommend, max_epochs=max_epochs)
    local: list[str] = []
    if recommend:  # public inputs only: the data file is not opened
        unit_index = None
        plan = plan_for(contract, None, release=True)
    else:
        # Read the data (header, cells, units), so the dry run refuses what train refuses; with
        # privacy.num_units declared the count is only a local check (more units than declared: a warning). A
        # local dry run may show the exact count where train would refuse it (N private and not declared).
        unit_index = count_units(contract.data, contract.privacy, seed=contract.training.seed)
        if not show_private and contract.privacy.num_units is None:
            why = private_count_reason(contract)
            if why is not None:  # before any plan: even a refusal's ε would be a function of the counted N
                raise BadInputError(
                    f"privacy.num_units is not declared and {why}: a plan on the counted N would publish a private "
                    "count; declare a public (rounded) N, or run dplora budget on a terminal (or with --show-private)"
                )
        plan = plan_for(contract, unit_index, release=False, log=lambda m: local.append(m.removeprefix("warning: ")))
    why = private_count_reason(contract) if contract.privacy.num_units is None else None
    if not show_private:
        local.clear()  # the data-count comparison with the declared N: a private diagnostic
    if why is not None:
        local.append(
            f"privacy.num_units is not declared and {why}: dplora train refuses to release on a counted N; "
            "declare a public (rounded) N"
        )
    report = {
        "num_units": plan.num_units,
        "num_units_source": plan.num_units_source,
        "protected_unit": plan.protected_unit.value,
        "unit_key": plan.unit_key,
        "sample_rate": plan.sample_rate,
        "expected_batch_size": plan.expected_batch_size,
        "steps": plan.steps,
        "noise_multiplier": plan.noise_multiplier,
        "noise_source": plan.noise_source,
        "max_grad_norm": plan.max_grad_norm,
        "delta": plan.delta,
        "one_over_n": 1.0 / plan.num_units,
        "target_epsilon": plan.target_epsilon,
        "epsilon": plan.epsilon,
        "epsilon_at": {f"{int(f * 100)}%": _eps_at_fraction(plan, f) for f in (0.25, 0.5, 0.75)},
        "accountant": plan.accountant.value,
        "accountant_version": plan.accountant_version,
        "accountant_note": plan.accountant_note,
        "adjacency": plan.adjacency.value,
        "warnings": [*local, *plan.warnings],
        "unit_note": f"{plan.protected_unit.value}-level: {unit_statement(plan.protected_unit)}",
        "epsilon_curve": [list(p) for p in plan.epsilon_curve],
        "units_per_rank": _units_per_rank(plan, world_size),
    }
    report["clipping"] = plan.clipping
    report["lr"], report["lr_schedule"], report["warmup_steps"] = plan.lr, plan.lr_schedule, plan.warmup_steps
    if contract.privacy.enabled:
        from dplora.accounting.ceiling import ceiling_entry

        report["attack_ceiling"] = ceiling_entry(plan.event)  # public q, σ, T, adjacency only
    if rec is not None:
        report["recommendation"] = rec.to_dict()
        if contract.privacy.enabled:
            add_candidate_ceilings(report["recommendation"], plan.adjacency)
    if unit_index is not None and show_private:
        report["not_covered_by_dp"] = {"note": PRIVATE_STATS_NOTE, "unit_stats": unit_index.stats()}
    if not contract.privacy.enabled:  # the non-private control: report its DP twin's plan, check no cap
        report["warnings"].append(
            "privacy.enabled=false: a NOT DIFFERENTIALLY PRIVATE control (no clipping, no noise, ε = ∞); the "
            "numbers above are its DP twin's, with which it shares N, q and T"
        )
    if contract.privacy.population and contract.privacy.enabled:
        from dplora.ledger.store import Ledger, default_ledger_path

        ledger = Ledger(ledger_path or default_ledger_path(), create=False)  # a dry run never creates a ledger
        from dplora.ledger.plans import check_plans

        check_plans(ledger, contract.privacy, [plan])
        spent = ledger.spent(contract.privacy.population)
        report["ledger"] = {
            "population": contract.privacy.population,
            "epsilon_spent_before": str(spent[0]),
            "delta_spent_before": str(spent[1]),
            "fits_cap": True,
        }
    if sweep:
        report["sweep"] = sweep_table(plan)
    if estimate:
        report["estimate"] = _estimate(contract, plan, why, log)
    if time_doc is not None:
        report["time_budget"] = time_doc | {"used_by_planner": rec is not None}
    return report


def _time_budget(contract, budget_seconds: float, *, recommend: bool, max_steps: int | None, log) -> dict:
    """``--time-budget``: plan provisionally from public inputs (declared N), load the model, time one synthetic
    step and convert the budget to epochs (:func:`dplora.plan.estimate.epochs_for_time`). No data is read.

    Raises:
        BadInputError: the probe batch does not fit in memory, or the budget is under a tenth of an epoch.
    """
    from dplora.plan.estimate import epochs_for_time
    from dplora.plan.resolve import plan_for, resolve_auto
    from dplora.recipe.build import estimate_without_data

    provisional, _ = resolve_auto(contract, max_steps=max_steps, force=recommend)
    plan = plan_for(provisional, None, release=True)
    inputs = estimate_without_data(provisional, plan, log=log or (lambda _m: None))
    if inputs is None:
        raise BadInputError("--time-budget: the probe batch does not fit in memory; lower training.physical_batch_size")
    return epochs_for_time(inputs, contract.privacy.num_units, budget_seconds)


CANDIDATE_CEILING_NOTE = (
    "attack ceiling: the highest true-positive rate of any membership test at 1 % false positives, from each "
    "candidate's PLD privacy profile (interval 1e-3: an upper bound within about 1e-4 of the record's)"
)


def add_candidate_ceilings(rec: dict, adjacency) -> None:
    """Add ``attack_ceiling`` (TPR at each FPR of :data:`~dplora.accounting.ceiling.CEILING_FPRS`, or None) to each
    calibrated candidate of a recommendation dict, in place, so a user can choose by attack success.

    Each comes from the candidate's public q, σ, T and the contract's adjacency
    (:func:`dplora.accounting.ceiling.attack_ceiling`, PLD interval from 1e-3 up); the other candidates' may be
    read from dplora's on-disk cache, the chosen one's is always computed.
    """
    from dplora.accounting.ceiling import CEILING_INTERVALS, attack_ceiling, fpr_label
    from dplora.accounting.events import DpSgdEvent

    chosen = (rec["choice"].get("expected_batch_size"), rec["choice"].get("steps"))
    for row in [*rec["candidates"], rec["choice"]]:
        ceiling = None
        if row.get("noise_multiplier") is not None:
            # the other rows may come from the cache (a table to choose by); the chosen plan's row is computed
            reuse = (row.get("expected_batch_size"), row.get("steps")) != chosen
            event = DpSgdEvent(
                sample_rate=row["sample_rate"],
                noise_multiplier=row["noise_multiplier"],
                steps=row["steps"],
                adjacency=adjacency,
            )
            ceiling = attack_ceiling(event, intervals=CEILING_INTERVALS[1:], use_cache=reuse)
        row["attack_ceiling"] = (
            None if ceiling is None else {fpr_label(a): t for a, t in zip(ceiling.fprs, ceiling.tprs, strict=True)}
        )
    rec["attack_ceiling_note"] = CANDIDATE_CEILING_NOTE


def _estimate(contract, plan: TrainingPlan, why: str | None, log) -> dict | None:
    """``--estimate``: the public time estimate (:mod:`dplora.plan.estimate`) after loading the model; None when
    the probe batch does not fit in memory.

    Raises:
        BadInputError: the plan rests on a counted private N (the estimate is public: it may use public numbers
            only).
    """
    if why is not None:
        raise BadInputError(
            f"--estimate is a public number and this plan rests on a counted N ({why}): declare privacy.num_units"
        )
    from dplora.recipe.build import estimate_without_data

    inputs = estimate_without_data(contract, plan, log=log or (lambda _m: None))
    return None if inputs is None else estimate_doc(inputs)


def _units_per_rank(plan: TrainingPlan, world_size: int) -> dict:
    """Expected units per rank per logical step with W processes (round-robin shards of the N units)."""
    from dplora.mechanism.sampling import expected_units_per_rank

    if world_size < 1:
        raise BadInputError(f"--world-size {world_size}: expected an integer ≥ 1")
    low, high = expected_units_per_rank(plan.sample_rate, plan.num_units, world_size)
    return {"world_size": world_size, "expected_min": low, "expected_max": high}


def sweep_table(plan: TrainingPlan) -> dict:
    """σ calibrated to the target for a few batch sizes and epoch counts around the contract (RDP, for speed).

    Larger batches at the same ε need less noise per example: maximise the batch, set σ just high enough.
    """
    from dplora.accounting import calibrate_noise
    from dplora.accounting.events import Accountant

    n = plan.num_units
    epochs = plan.steps * plan.expected_batch_size / n
    rows = []
    for bf in SWEEP_BATCH_FACTORS:
        batch = max(1, int(plan.expected_batch_size * bf))
        if batch > n:
            continue
        for ef in SWEEP_EPOCH_FACTORS:
            steps = max(1, math.ceil(epochs * ef * n / batch))
            try:
                sigma = calibrate_noise(
                    target_epsilon=plan.target_epsilon,
                    sample_rate=batch / n,
                    steps=steps,
                    delta=plan.delta,
                    accountant="rdp",
                    adjacency="add_remove",
                )
            except PlanRefusedError:
                sigma = None
            rows.append(
                {
                    "expected_batch_size": batch,
                    "epochs": round(epochs * ef, 3),
                    "steps": steps,
                    "noise_multiplier": sigma,
                    "noise_per_unit": None if sigma is None else sigma / batch,
                }
            )
    note = "RDP add/remove for speed (PLD/PRV need at most these σ)"
    if plan.accountant is not Accountant.RDP or plan.adjacency.value != "add_remove":
        note += f"; the plan itself uses {plan.accountant.value} with {plan.adjacency.value}"
    return {"accountant": "rdp", "note": note, "rows": rows}


def plot_curve(report: dict, path: Path) -> dict | None:
    """Draw the plan's checked ε against logical steps (from step 1), with the target line, and beside it the f-DP
    trade-off curve (the attack ceiling: the highest TPR of any membership test at each FPR, from the PLD privacy
    profile of the plan's public q, σ, T and adjacency; :func:`dplora.accounting.ceiling.tradeoff_curve`), to a PNG
    (matplotlib).

    Returns:
        The curve drawn, ``{"fpr": [...], "tpr": [...]}`` (probabilities), or None when none is drawn (a
        non-private control, no σ, or a PLD past dplora's time limit: the panel then says so).
    Raises:
        BadInputError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, eps = zip(*report["epsilon_curve"], strict=True) if report["epsilon_curve"] else ((), ())
    fig, (ax, side) = plt.subplots(1, 2, figsize=(11, 4))
    # The plan's per-step bound: ε at each step is the value at the next curve point (every step up to 20,000),
    # which is what "steps-pre" draws; the training loop reads the same values.
    ax.plot(
        (0, *steps),
        (0.0, *eps),
        drawstyle="steps-pre",
        marker="." if len(steps) < 50 else None,
        label=f"ε ({report['accountant']})",
    )
    ax.axhline(report["target_epsilon"], color="red", linestyle="--", label="target ε")
    ax.set_xlabel("logical steps T")
    ax.set_ylabel(f"ε at δ={report['delta']:g}")
    ax.set_title(f"q={report['sample_rate']:.4g}, σ={report['noise_multiplier']:.4f}, {report['adjacency']}")
    ax.legend()
    curve = _tradeoff(report)
    side.plot((0, 1), (0, 1), color="grey", linestyle=":", label="guessing (TPR = FPR)")
    if curve is not None:
        side.plot(curve["fpr"], curve["tpr"], label=f"attack ceiling after T = {report['steps']}")
        side.set_xscale("log")
        side.set_xlim(curve["fpr"][0], 1.0)
        side.legend(loc="lower right")
    else:
        side.text(0.5, 0.5, "attack ceiling not stated", ha="center", va="center", transform=side.transAxes)
    side.set_ylim(0.0, 1.0)
    side.set_xlabel("false-positive rate α of any membership test")
    side.set_ylabel("highest true-positive rate")
    side.set_title("f-DP trade-off (PLD privacy profile)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as err:
        raise BadInputError(f"cannot write plot {path}: {err.strerror}") from None
    finally:
        plt.close(fig)
    return curve


def _tradeoff(report: dict) -> dict | None:
    """The plan's trade-off curve from the report's public q, σ, T and adjacency (None: nothing to draw)."""
    from dplora.accounting.ceiling import tradeoff_curve
    from dplora.accounting.events import DpSgdEvent

    if not report.get("attack_ceiling") or report.get("noise_multiplier") is None:
        return None  # a non-private control, or no σ: no DP curve
    event = DpSgdEvent(
        sample_rate=report["sample_rate"],
        noise_multiplier=report["noise_multiplier"],
        steps=report["steps"],
        adjacency=report["adjacency"],
    )
    try:
        ceiling = tradeoff_curve(event)
    except (ValueError, ArithmeticError, MemoryError):
        return None
    return None if ceiling is None else {"fpr": list(ceiling.fprs), "tpr": list(ceiling.tprs)}
