"""The audit report in Markdown (``audit.md``, and what ``dplora audit`` prints): the verdict, the bound and the
release's ceiling (rounded up), the measured TPR points, the power check, exposure and the MIA AUC."""

from __future__ import annotations

import decimal


def _fmt(x) -> str:
    return "n/a" if x is None else x if isinstance(x, str) else f"{x:.3f}"


def _verdict_words(report: dict) -> str:
    """The verdict in words (older reports have only ``violation``)."""
    if report["violation"]:
        what = []
        if report.get("bound_violation", True):
            what.append("the lower bound exceeds the claimed ε")
        if report.get("ceiling_exceeded"):
            what.append("a measured TPR exceeds the release's attack ceiling beyond its confidence interval")
        return "**VIOLATION**: " + " and ".join(what)
    if report.get("verdict") == "uninformative":
        return "**uninformative** (not a pass): " + "; ".join(report["uninformative_reasons"])
    return "no violation detected"


def rounded_up(x: float, decimals: int) -> str:
    """``x`` as text with ``decimals`` decimals, rounded UP: a ceiling printed is never below its value (rounding
    to nearest could print one below it). E.g. ``rounded_up(0.12341, 4) == "0.1235"``; a value whose shortest repr
    has at most ``decimals`` decimals stays (``rounded_up(0.0051, 4) == "0.0051"``).

    The ceiling is taken in decimal on ``repr(x)`` (the shortest text that reads back as the same float), never on
    ``x * 10**decimals`` in binary: that product rounds, so 0.0051 printed 0.0052 and a float one step above 0.0009
    printed 0.0009, below its value.

    Args:
        x: a finite float (a TPR or an ε̂ ceiling); decimals: digits after the point (>= 0).
    """
    exact = decimal.Decimal(repr(float(x)))
    wide = decimal.Context(prec=400 + decimals)  # room for any finite float's integer digits
    step = decimal.Decimal(1).scaleb(-decimals)
    return f"{exact.quantize(step, rounding=decimal.ROUND_CEILING, context=wide):.{decimals}f}"


def _tpr_lines(report: dict) -> list[str]:
    """One line per FPR: measured TPR (lower limit) against the ceiling."""
    lines = []
    for p in report.get("tpr_vs_ceiling") or []:
        ceiling = "n/a (no DP)" if p["ceiling"] is None else rounded_up(p["ceiling"], 4)
        at_upper = (
            ""
            if p["ceiling_at_fpr_upper"] is None
            else f" ({rounded_up(p['ceiling_at_fpr_upper'], 4)} at the FPR's upper "
        )
        at_upper += f"limit {p['fpr_upper']:.4f})" if at_upper else ""
        lines.append(
            f"- TPR at FPR {100 * p['fpr']:g} %: measured {p['tpr']:.4f} ({p['true_positives']}/{p['inserted']}, "
            f"lower limit {p['tpr_lower']:.4f}; {p['false_positives']}/{p['held_out']} false positives); release "
            f"ceiling {ceiling}{at_upper}" + (" — EXCEEDED" if p["exceeded"] else "")
        )
    return lines


def summary_markdown(report: dict) -> str:
    """A short markdown summary of the report."""
    verdict = _verdict_words(report)
    ceiling = report.get("epsilon_lower_bound_ceiling")
    power_line = (
        []
        if ceiling is None
        else [
            f"- this audit's ceiling: with {report['canaries']} canaries and {report['guesses']} guesses no outcome "
            f"can show more than ε̂ = {rounded_up(ceiling, 3)} (δ={report['delta']:g}; "
            f"{rounded_up(report['epsilon_lower_bound_ceiling_delta0'], 3)} at δ = 0)"
        ]
    )
    return "\n".join(
        [
            "# dplora audit",
            "",
            f"- data: {report['data_source']}; DP: {report['differentially_private']}; run: `{report['run_folder']}`",
            f"- canaries: {report['canaries']} ({report['inserted']} inserted, {report['records_per_canary']} "
            f"record(s) each)",
            f"- guesses: {report['guesses']} ({report['guesses_in']} in, {report['guesses_out']} out), "
            f"correct: {report['correct']}",
            f"- ε lower bound ({report['confidence']:.0%}, δ={report['delta']:g}): {report['epsilon_lower_bound']:.3f}"
            f"; claimed ε: {_fmt(report['claimed_epsilon'])} — {verdict}",
            *power_line,
            *_tpr_lines(report),
            *power_check_lines(report),
            f"- MIA AUC: {_fmt(report['mia_auc'])}",
            f"- exposure (bits, {report['candidates']} candidates; chance ≈ {report['exposure_chance_bits']:.2f}, "
            f"max {report['exposure_max_bits']:.2f}): inserted {_fmt(report['exposure_inserted_mean'])}, "
            f"held out {_fmt(report['exposure_held_out_mean'])}",
            "",
        ]
    )


def power_check_lines(report: dict) -> list[str]:
    """The power check's line of the audit summary: [] without ``report["power_check"]``, else one Markdown line.

    Args:
        report: an audit report (``audit.json``); its ``power_check`` entry holds ``data_source``,
            ``epsilon_lower_bound``, ``epsilon_lower_bound_ceiling``, ``fraction_of_ceiling``, ``correct``,
            ``guesses``, ``mia_auc`` and an optional ``data_note`` (:data:`dplora.audit.runner.POWER_DATA_NOTE` for a
            copy declared public), appended as "its data: ...".

    Raises:
        KeyError: a power check entry without one of those keys.
    """
    check = report.get("power_check")
    if not check:
        return []
    return [
        f"- power check (the same canaries, a run without noise on {check['data_source']} data): ε̂ "
        f"{check['epsilon_lower_bound']:.3f} of the ceiling {check['epsilon_lower_bound_ceiling']:.3f} "
        f"({100 * check['fraction_of_ceiling']:.0f} %), {check['correct']}/{check['guesses']} correct, "
        f"MIA AUC {_fmt(check['mia_auc'])}" + (f"; its data: {check['data_note']}" if check.get("data_note") else "")
    ]
