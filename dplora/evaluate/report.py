"""Held-out numbers in words and per group: the per-group statistics (groups under :data:`MIN_GROUP_RECORDS`
records counted, never named) and the report's lines. See :mod:`dplora.evaluate.heldout` for what is measured.
"""

from __future__ import annotations

import dataclasses

from dplora.errors import excerpt, one_line

MIN_GROUP_RECORDS = 10  # smaller groups are counted, never named (see the module docstring)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GroupStat:
    """Held-out numbers of one group (one value of the group column).

    Attributes:
        group: the group's value, as text.
        records: held-out records in the group.
        tokens: their target tokens.
        loss: Σ NLL / Σ target tokens over the group's records, nats per token (None without a target token).
        accuracy: share of the group's records answered correctly (None when no correctness was given).
    """

    group: str
    records: int
    tokens: int
    loss: float | None
    accuracy: float | None = None


def group_stats(
    groups, nll, tokens, correct=None, *, min_records: int = MIN_GROUP_RECORDS
) -> tuple[list[GroupStat], dict]:
    """Aggregate per-record numbers by group: the token-weighted loss (and accuracy) of each group.

    A pure function (no model): ``dplora eval`` and ``scripts/utility_bench.py`` both call it.

    Args:
        groups: the group value of each record, length R (any value; compared as ``str``).
        nll: summed negative log-likelihood of each record's target tokens, nats, length R.
        tokens: target tokens of each record, length R.
        correct: optional, whether each record was answered correctly (bools), length R.
        min_records: groups with fewer records are not named: they are left out of the list and counted in the
            second return value (their records still count in the overall numbers).

    Returns:
        (stats, hidden): one :class:`GroupStat` per group with at least ``min_records`` records, sorted by group;
        ``hidden`` = {"groups": groups left out, "records": their records, "min_records": the threshold}.

    Raises:
        ValueError: the sequences differ in length, or ``min_records`` < 1.

    >>> stats, hidden = group_stats(["a", "b", "a"], [2.0, 9.0, 4.0], [1, 3, 2], min_records=2)
    >>> stats
    [GroupStat(group='a', records=2, tokens=3, loss=2.0, accuracy=None)]
    >>> hidden
    {'groups': 1, 'records': 1, 'min_records': 2}
    """
    groups = [str(g) for g in groups]
    columns = [nll, tokens] + ([] if correct is None else [correct])
    if any(len(c) != len(groups) for c in columns):
        raise ValueError(f"group_stats: {len(groups)} groups but {[len(c) for c in columns]} values")
    if min_records < 1:
        raise ValueError(f"Expected min_records >= 1, got {min_records}")
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    stats, hidden_groups, hidden_records = [], 0, 0
    for g in sorted(members):
        rows = members[g]
        if len(rows) < min_records:
            hidden_groups, hidden_records = hidden_groups + 1, hidden_records + len(rows)
            continue
        count = sum(int(tokens[i]) for i in rows)
        loss = sum(float(nll[i]) for i in rows) / count if count else None
        accuracy = None if correct is None else sum(bool(correct[i]) for i in rows) / len(rows)
        stats.append(GroupStat(group=g, records=len(rows), tokens=count, loss=loss, accuracy=accuracy))
    return stats, {"groups": hidden_groups, "records": hidden_records, "min_records": min_records}


def report_lines(evaluation) -> list[str]:
    """The evaluation (a :class:`dplora.evaluate.heldout.Evaluation`) as a few lines of text for the operator
    (numbers only, never held-out text)."""
    from dplora.mechanism.control import NOT_DP

    b, a = evaluation.base, evaluation.adapter
    lines = [
        f"held-out: {evaluation.source}; {b.records} records, {b.tokens} target tokens",
        f"  {evaluation.label}",
    ]
    if not evaluation.differentially_private:
        lines.append(f"  adapters: {NOT_DP} (privacy.enabled=false control)")
    lines += [
        f"  {'':8} {'loss/token':>10} {'perplexity':>11}",
        f"  {'base':8} {b.loss:10.4f} {b.perplexity:11.3f}",
        f"  {'adapter':8} {a.loss:10.4f} {a.perplexity:11.3f}   (Δ loss {a.loss - b.loss:+.4f})",
    ]
    if evaluation.accuracy is not None:
        acc = evaluation.accuracy
        lines.append(
            f"  exact match on {acc['column']!r}: base {acc['base']:.3f}, adapter {acc['adapter']:.3f} "
            f"({acc['records']} records)"
        )
    if evaluation.groups is not None:
        lines += _group_lines(evaluation.groups)
    if getattr(evaluation, "classification", None) is not None:
        lines += classification_lines(evaluation.classification)
    return lines


def classification_lines(c: dict) -> list[str]:
    """The report's classification lines: accuracy under the contract's scoring with the other beside, then
    per-label recall under both, base and adapter; label names bounded and escaped (the labels are declared public
    in the contract).

    Args:
        c: an evaluation's ``classification`` dict (:func:`dplora.evaluate.heldout.evaluate_model`): "calibration",
            "calibration_input", "labels" (a count), "records", "out_of_set", and "base"/"adapter" from
            :func:`dplora.evaluate.classify.classification_stats`.

    Returns:
        Text lines (no newline), indented for the report.
    """
    b, a = c["base"], c["adapter"]

    def num(x):
        return f"{x:.3f}" if x is not None else "-"

    # the headline follows data.calibration; the other scoring is printed beside, so neither is hidden
    calibrated = c["calibration"] == "contextual"
    other = "uncalibrated" if calibrated else "calibrated"
    scoring = (
        f"per token, calibrated on {excerpt(c['calibration_input'], 40)}" if calibrated else "per token, uncalibrated"
    )
    lines = [
        f"  classification over {c['labels']} declared labels, {scoring}: "
        f"accuracy base {num(b['accuracy'])}, adapter {num(a['accuracy'])} ({other}: base "
        f"{num(b[f'accuracy_{other}'])}, adapter {num(a[f'accuracy_{other}'])}); {c['records']} records, "
        f"{c['out_of_set']} with a label outside the set (scored wrong)",
    ]
    if a["per_label"]:
        lines.append(
            f"    {'label':28} {'records':>7} {'recall base':>11} {'adapter':>8} {other + ' base':>17} {'adapter':>8}"
        )
        for lb, la in zip(b["per_label"], a["per_label"], strict=True):
            name = one_line(la["label"], limit=28)
            lines.append(
                f"    {name:28} {la['records']:7d} {num(lb['recall']):>11} {num(la['recall']):>8} "
                f"{num(lb[f'recall_{other}']):>17} {num(la[f'recall_{other}']):>8}"
            )
    hidden = a["hidden"]
    if hidden["labels"]:
        lines.append(
            f"    ({hidden['labels']} labels with fewer than {hidden['min_records']} records, {hidden['records']} "
            "records in all, have no recall shown)"
        )
    return lines


def _group_lines(groups: dict) -> list[str]:
    """Per-group table: records, tokens, loss base → adapter (and accuracy); group names bounded and escaped."""
    with_acc = any(g.accuracy is not None for g in groups["adapter"])
    head = f"  per group of {excerpt(groups['column'])}:"
    lines = [head, f"    {'group':28} {'records':>7} {'tokens':>7} {'base':>8} {'adapter':>8} {'Δ loss':>8}"]
    if with_acc:
        lines[-1] += f" {'acc base':>8} {'adapter':>8}"

    def num(x, fmt):
        return format(x, fmt) if x is not None else "-"

    for b, a in zip(groups["base"], groups["adapter"], strict=True):
        name = one_line(b.group, limit=28)
        delta = a.loss - b.loss if a.loss is not None and b.loss is not None else None
        line = f"    {name:28} {b.records:7d} {b.tokens:7d} {num(b.loss, '8.4f')} {num(a.loss, '8.4f')}"
        line += f" {num(delta, '+8.4f')}"
        if with_acc:
            line += f" {num(b.accuracy, '8.3f')} {num(a.accuracy, '8.3f')}"
        lines.append(line)
    hidden = groups["hidden"]
    if hidden["groups"]:
        lines.append(
            f"    ({hidden['groups']} groups with fewer than {hidden['min_records']} records, {hidden['records']} "
            "records in all, are not shown by name)"
        )
    return lines
