"""How ``dplora budget`` prints its report: rich tables of the plan, the ε curve, the sweep and the planner's
candidates with their attack ceilings (the report itself is built by :func:`dplora.tuning.budget.budget_report`)."""

from __future__ import annotations

from dplora.plan.estimate import EstimateInputs, duration_text, estimate_line


def print_report(report: dict, console, warn=None) -> None:
    """Render the report as rich tables on ``console``; ``warning:`` lines go to ``warn`` (a stderr console, as
    ``train`` prints its warnings; default ``console``)."""
    warn = console if warn is None else warn
    from rich.table import Table

    t = Table(title="dplora budget", show_header=False)
    t.add_column("quantity")
    t.add_column("value")
    t.add_row(
        "protected unit", f"{report['protected_unit']}" + (f" (key {report['unit_key']})" if report["unit_key"] else "")
    )
    t.add_row("N (protected units)", f"{report['num_units']} (from {report['num_units_source']})")
    t.add_row("q = B/N", f"{report['sample_rate']:.6g} (B={report['expected_batch_size']})")
    ranks = report["units_per_rank"]
    low, high = ranks["expected_min"], ranks["expected_max"]
    per_rank = f"{low:.4g}" if low == high else f"{low:.4g} to {high:.4g}"
    t.add_row("units per rank per step", f"{per_rank} expected, W={ranks['world_size']} processes")
    t.add_row("T (logical steps)", str(report["steps"]))
    t.add_row("σ (noise multiplier)", f"{report['noise_multiplier']:.4f} ({report['noise_source']})")
    t.add_row("C (max_grad_norm)", f"{report['max_grad_norm']:g}")
    t.add_row("δ vs 1/N", f"{report['delta']:.3g} vs {report['one_over_n']:.3g}")
    t.add_row("adjacency", report["adjacency"])
    for k, v in report["epsilon_at"].items():
        t.add_row(f"ε at {k} of T (step {v['step']})", f"≤ {v['epsilon']:.4f}")
    t.add_row("ε at T", f"{report['epsilon']:.4f} (target {report['target_epsilon']:g})")
    t.add_row("accountant", f"{report['accountant']} ({report['accountant_version']})")
    if report.get("accountant_note"):
        t.add_row("accountant note", report["accountant_note"])
    private = report.get("not_covered_by_dp")
    if private:
        stats = private["unit_stats"]
        r = stats["records_per_unit"]
        t.add_row(
            "records per unit (not covered by DP)",
            f"min {r['min']}, median {r['median']:g}, p95 {r['p95']:g}, max {r['max']}",
        )
        t.add_row(
            "records dropped by cap (not covered by DP)",
            f"{stats['dropped_by_cap']} (max per unit after cap: {stats['max_records_per_unit_after_cap']})",
        )
    if report.get("attack_ceiling"):
        t.add_row("attack ceiling (TPR at FPR)", ceiling_cell(report["attack_ceiling"]))
    if "ledger" in report:
        t.add_row(
            "ledger", f"{report['ledger']['population']}: ε spent before {report['ledger']['epsilon_spent_before']}"
        )
    console.print(t)
    console.print(f"note: {report['unit_note']}", markup=False, soft_wrap=True)
    if report.get("attack_ceiling"):
        from dplora.accounting.ceiling import ceiling_sentence

        said = ceiling_sentence(report["attack_ceiling"], f"one {report['protected_unit']} was used")
        console.print(f"note: {said}", markup=False, soft_wrap=True)
    if private:
        console.print(f"note: rows marked 'not covered by DP' are {private['note']}", markup=False, soft_wrap=True)
    for w in report["warnings"]:
        warn.print(f"warning: {w}", markup=False, soft_wrap=True)  # one line each, never wrapped
    if "estimate" in report:
        doc = report["estimate"]
        line = "estimate: none (the synthetic probe batch did not fit in accelerator memory)"
        console.print(line if doc is None else estimate_line(EstimateInputs(**doc["inputs"])), markup=False,
                      soft_wrap=True)  # fmt: skip
    if "time_budget" in report:
        tb = report["time_budget"]
        used = "the planner's E" if tb["used_by_planner"] else f"set training.epochs={tb['epochs']:g} to use it"
        console.print(
            f"time budget {duration_text(tb['budget_seconds'])}: one epoch is about "
            f"{duration_text(tb['epoch_seconds'])} ({tb['forwards_per_epoch']} forward(s) of "
            f"{tb['physical_batch']} synthetic records at "
            f"{tb['probe_seconds']:.3g} s on {tb['device']}), so E = {tb['epochs']:g} epochs fit ({used}); public: "
            "from the declared N and a timed synthetic step",
            markup=False,
            soft_wrap=True,
        )
    if "recommendation" in report:
        _print_recommendation(report["recommendation"], console)
    if "sweep" in report:
        s = Table(title=f"σ for target ε={report['target_epsilon']:g} ({report['sweep']['note']})")
        for col in ("batch B", "epochs", "T", "σ", "σ/B"):
            s.add_column(col)
        for row in report["sweep"]["rows"]:
            sig = row["noise_multiplier"]
            s.add_row(
                str(row["expected_batch_size"]),
                f"{row['epochs']:g}",
                str(row["steps"]),
                "unreachable" if sig is None else f"{sig:.3f}",
                "-" if sig is None else f"{row['noise_per_unit']:.4f}",
            )
        console.print(s)


def ceiling_cell(entry: dict) -> str:
    """``0.89 % at 0.1 %, 3.06 % at 1 %, 14.1 % at 10 %`` (or why it is not stated)."""
    if not entry.get("available"):
        return "not stated: " + str(entry.get("reason"))
    at = entry["true_positive_rate_at"]
    from dplora.accounting.ceiling import percent_up

    return ", ".join(f"{percent_up(v, 2)} % at {k.replace('%', ' %')}" for k, v in at.items())


def tpr_cell(ceiling: dict | None) -> str:
    """A candidate's ceiling at 1 % false positives, in percent (``-``: not calibrated or not stated)."""
    from dplora.accounting.ceiling import percent_up

    return "-" if ceiling is None else f"{percent_up(ceiling['1%'], 2)} %"


def _print_recommendation(rec: dict, console) -> None:
    """The planner's choice (B, T, q, σ, σ/B, lr) and the candidates it weighed, one row each."""
    from rich.table import Table

    c = rec["choice"]
    console.print(
        f"planner choice: B={c['expected_batch_size']}, T={c['steps']}, q={c['sample_rate']:.4g}, "
        f"σ={c['noise_multiplier']:.4f}, σ/B={c['noise_per_unit']:.5f}, lr={c['lr']:.3g}, "
        f"schedule {rec['lr_schedule']} with {rec['warmup_steps']} warmup steps",
        markup=False,
        soft_wrap=True,
    )
    console.print(f"rule: {rec['rule']}", markup=False, soft_wrap=True)
    if str(rec["inputs"].get("lr_ref_source", "")).startswith("data.task="):  # training.lr: auto
        console.print(
            f"lr_ref: {rec['inputs']['lr_ref']:g} at B = 32, the rate for {rec['inputs']['lr_ref_source']} "
            "(training.lr: auto; docs/planner.md)",
            markup=False,
            soft_wrap=True,
        )
    cap = rec["inputs"].get("max_epochs")
    budget = f"E up to {cap:g}" if cap else f"E={rec['inputs']['epochs']:g}"
    t = Table(title=f"candidates weighed ({budget}, N={rec['inputs']['num_units']}, T ≥ {rec['inputs']['min_steps']})")
    ceilings = "attack_ceiling_note" in rec
    for col in ("B", "E", "T", "q", "σ", "ε", "σ/B", *(("TPR@1%",) if ceilings else ()), "lr", "note"):
        t.add_column(col)
    below, skipped = 0, 0
    for row in rec["candidates"]:
        sig = row["noise_multiplier"]
        chosen = (row["expected_batch_size"], row["steps"]) == (c["expected_batch_size"], c["steps"])
        why = row["excluded"] or ""
        if why.startswith(("T=", "not weighed")) and not chosen:  # counted below the table, not drawn
            below += why.startswith("T=")
            skipped += why.startswith("not weighed")
            continue
        t.add_row(
            str(row["expected_batch_size"]),
            "-" if row.get("epochs") is None else f"{row['epochs']:g}",
            str(row["steps"]),
            f"{row['sample_rate']:.4g}",
            "-" if sig is None else f"{sig:.4f}",
            "-" if row["epsilon"] is None else f"{row['epsilon']:.4f}",
            "-" if sig is None else f"{row['noise_per_unit']:.5f}",
            *((tpr_cell(row.get("attack_ceiling")),) if ceilings else ()),
            f"{row['lr']:.3g}",
            "chosen" if chosen else (row["excluded"] or ""),
        )
    console.print(t)
    if below or skipped:
        floor = rec["inputs"]["min_steps"]
        console.print(
            f"note: not shown: {below} candidate(s) below the step floor T ≥ {floor}, {skipped} not weighed (another "
            "has a q at least theirs and a T at most theirs, so a σ/B no larger); --json lists every candidate",
            markup=False,
            soft_wrap=True,
        )
    if ceilings:
        console.print(f"note: {rec['attack_ceiling_note']}", markup=False, soft_wrap=True)
