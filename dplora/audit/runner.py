"""`dplora audit`: insert canaries, train through :func:`dplora.recipe.train.run_training`, score, bound, report.

The audit has no training code of its own: the canaries are appended to the training table (after the held-out
split, each its own protected unit) and the run is an ordinary ``dplora train`` run into ``<audit>/run``, signed
with a throw-away key (the audit's run is evidence, not a release). Scores are the loss drop of each canary's reply
(base model minus adapters, mean nats per target token): a member's loss falls. The report gives the one-run ε
lower bound (:mod:`dplora.audit.bound`), exposure and the MIA AUC.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import secrets
from pathlib import Path

from dplora import atomic
from dplora.audit import bound, canaries, scores
from dplora.errors import BadInputError

REPORT_FILENAME = "audit.json"
SUMMARY_FILENAME = "audit.md"
PLOT_FILENAME = "audit_scores.png"


class DataSource(str, enum.Enum):
    """What the audited data is: the baseline without DP runs only on public or surrogate (demo) data."""

    PRIVATE = "private"
    PUBLIC = "public"
    SURROGATE = "surrogate"


@dataclasses.dataclass(frozen=True, kw_only=True)
class AuditOptions:
    """The audit's own settings (none of them changes training).

    Attributes:
        canaries: m, canaries (each one protected unit, inserted with probability 1/2).
        copies: records per canary inside its unit (1 at row level).
        candidates: random secrets of the canary format, the reference for exposure.
        guesses: k₊ = k₋ guesses on each side (default m // 4), fixed before the scores are seen.
        confidence: of the lower bound (0.95).
        data_source: private | public | surrogate.
        plot: write a PNG histogram of member and non-member scores.
    """

    canaries: int = 100
    copies: int = 1
    candidates: int = 1000
    guesses: int | None = None
    confidence: float = 0.95
    data_source: DataSource = DataSource.PRIVATE
    plot: bool = False


def check_options(contract, options: AuditOptions) -> None:
    """Refuse what the audit cannot do (exit 2).

    Raises:
        BadInputError: a non-private baseline on private data, copies at row level, too few canaries or
            guesses out of range.
    """
    from dplora.engine import control

    if control.is_control(contract) and options.data_source is DataSource.PRIVATE:
        raise BadInputError(
            "privacy.enabled=false audits run only on public or surrogate data (e.g. dplora demo-data): "
            "pass --data-source surrogate or public"
        )
    if options.canaries < 4:
        raise BadInputError(f"--canaries={options.canaries}: give at least 4")
    if options.copies > 1 and contract.privacy.unit_key is None:
        raise BadInputError(f"--copies={options.copies}: a row-level canary is one row; copies need a unit key")
    k = options.guesses if options.guesses is not None else options.canaries // 4
    if not 1 <= 2 * k <= options.canaries:
        raise BadInputError(f"--guesses={k}: need 1 <= 2·guesses <= canaries={options.canaries}")
    if options.candidates < 1:
        raise BadInputError(f"--candidates={options.candidates}: give at least 1")


def run_audit(contract, options: AuditOptions, *, audit_dir: Path, train_kwargs: dict, log=print) -> dict:
    """Insert canaries, train as ``dplora train`` does, score them and write ``audit.json`` and ``audit.md``.

    Args:
        contract: the validated contract whose ``training.output_dir`` is ``<audit_dir>/run``.
        options: :class:`AuditOptions`.
        audit_dir: the audit's folder (created).
        train_kwargs: passed on to :func:`dplora.recipe.train.run_training` (threads, progress, contract_path, ...).

    Returns:
        The report (a dict, as written to ``audit.json``).

    Raises:
        BadInputError, PlanRefusedError, TrainingFailedError: from training (no report is written).
    """
    from dplora.recipe.train import run_training
    from dplora.release.keys import generate_keypair

    check_options(contract, options)
    audit_dir.mkdir(parents=True, exist_ok=True)
    drawn = canaries.make_canaries(options.canaries)
    extra = [
        row for c in drawn if c.inserted for row in canaries.canary_rows(contract, c.unit_id, c.secret, options.copies)
    ]
    key, _ = generate_keypair(audit_dir / "audit-run.key", overwrite=True)  # the audit run's own, thrown away
    try:
        result = run_training(contract, signing_key=key, data_key=None, extra_records=extra, log=log, **train_kwargs)
    finally:
        key.unlink(missing_ok=True)
    measured = _score(result.output_dir, contract, drawn, options, train_kwargs.get("threads"), log)
    report = _report(result, contract, drawn, measured, options)
    atomic.write_json(audit_dir / REPORT_FILENAME, report, sort_keys=False)
    atomic.write_text(audit_dir / SUMMARY_FILENAME, summary_markdown(report))
    if options.plot:
        _plot(audit_dir / PLOT_FILENAME, drawn, measured["score"])
    _stamp_reports(audit_dir, result)
    return report


def _stamp_reports(audit_dir: Path, result) -> None:
    """The audit's report files carry its run's ``started_at`` (taken before the data was read), not the time they
    were written: that would time the private audit run (issue 40)."""
    from dplora.release.read import read_statement
    from dplora.run.outputs import fix_mtimes

    statement = read_statement(Path(result.release_path)) if result.release_path else None
    started = (statement or {}).get("predicate", {}).get("started_at")
    if started:
        fix_mtimes(audit_dir, started)  # the reports, the audit run's folders and the audit folder itself


def _score(run_folder: Path, contract, drawn, options: AuditOptions, threads, log) -> dict:
    """Per canary: adapter loss, base loss, score = base − adapter; exposure against random candidates."""
    import datasets

    from dplora.data.units import tokenize_records
    from dplora.release.read import load_adapter_model, read_run

    model, tokenizer, device = load_adapter_model(read_run(run_folder), threads=threads, log=log)
    kw = {"pad_id": tokenizer.pad_token_id, "device": device, "batch_size": contract.training.fixed_physical_batch_size}

    def examples(secrets_: list[str]):
        rows = [canaries.canary_rows(contract, f"c{i}", s)[0] for i, s in enumerate(secrets_)]
        return tokenize_records(datasets.Dataset.from_list(rows), tokenizer, contract)

    canary_examples = examples([c.secret for c in drawn])
    adapter = scores.sequence_losses(model, canary_examples, **kw)
    with model.disable_adapter():
        base = scores.sequence_losses(model, canary_examples, **kw)
    rng = secrets.SystemRandom()
    taken = {c.secret for c in drawn}
    pool = []
    while len(pool) < options.candidates:
        s = canaries.random_secret(rng)
        if s not in taken:
            pool.append(s)
    candidate = scores.sequence_losses(model, examples(pool), **kw)
    return {
        "adapter_loss": adapter,
        "base_loss": base,
        "score": [b - a for a, b in zip(adapter, base, strict=True)],
        "exposure": [scores.exposure(a, candidate) for a in adapter],
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _report(result, contract, drawn, measured: dict, options: AuditOptions) -> dict:
    """The audit report: bound, claimed ε, exposure, AUC, the mechanism, the ledger charge and every canary."""
    from dplora.audit.attach import mechanism_of

    plan = result.plan
    m = len(drawn)
    k = options.guesses if options.guesses is not None else m // 4
    inserted = [c.inserted for c in drawn]
    r, v = bound.count_correct(measured["score"], inserted, k_in=k, k_out=k)
    lower = bound.epsilon_lower_bound(m=m, r=r, v=v, delta=plan.delta, confidence=options.confidence)
    claimed = result.epsilon_spent if result.differentially_private else math.inf
    members = [s for s, i in zip(measured["score"], inserted, strict=True) if i]
    others = [s for s, i in zip(measured["score"], inserted, strict=True) if not i]
    exp_in = [e for e, i in zip(measured["exposure"], inserted, strict=True) if i]
    exp_out = [e for e, i in zip(measured["exposure"], inserted, strict=True) if not i]
    auc = scores.auc(members, others) if members and others else None
    return {
        "audit": "one-run canary audit (Steinke, Nasr & Jagielski 2023, arXiv 2305.08846, Thm 3)",
        "run_folder": str(result.output_dir),
        "run_id": result.run_id,
        "data_source": options.data_source.value,
        "differentially_private": result.differentially_private,
        "claimed_epsilon": "infinite" if math.isinf(claimed) else claimed,
        "delta": plan.delta,
        "epsilon_lower_bound": lower,
        "confidence": options.confidence,
        "violation": lower > claimed,
        "canaries": m,
        "inserted": sum(inserted),
        "records_per_canary": options.copies,
        "guesses_in": k,
        "guesses_out": k,
        "guesses": r,
        "correct": v,
        "mia_auc": auc,
        "candidates": options.candidates,
        "exposure_max_bits": math.log2(options.candidates + 1),
        "exposure_chance_bits": 1 / math.log(2),
        "exposure_inserted_mean": _mean(exp_in),
        "exposure_held_out_mean": _mean(exp_out),
        "steps": result.steps_done,
        "mechanism": mechanism_of(plan, contract) if result.differentially_private else None,
        "ledger": _ledger_entry(result, contract),
        "per_canary": [
            {
                "unit_id": c.unit_id,
                "secret": c.secret,
                "inserted": c.inserted,
                "adapter_loss": measured["adapter_loss"][i],
                "base_loss": measured["base_loss"][i],
                "score": measured["score"][i],
                "exposure": measured["exposure"][i],
            }
            for i, c in enumerate(drawn)
        ],
    }


def _ledger_entry(result, contract) -> dict:
    """Whether the audit's run was charged to the ledger, as ``dplora train`` charges: every DP run (under its
    population, else as an unassigned run) and a non-private control only on a population."""
    population = contract.privacy.population
    charged = population is not None or result.differentially_private
    return {
        "charged": charged,
        "population": population,
        "unassigned": charged and population is None,
        "run_id": result.run_id if charged else None,
        "epsilon": (result.epsilon_spent if result.differentially_private else "infinite") if charged else None,
        "delta": result.plan.delta if charged else None,
    }


def _fmt(x) -> str:
    return "n/a" if x is None else x if isinstance(x, str) else f"{x:.3f}"


def summary_markdown(report: dict) -> str:
    """A short markdown summary of the report."""
    verdict = "**VIOLATION**: the lower bound exceeds the claimed ε" if report["violation"] else "no violation detected"
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
            f"- MIA AUC: {_fmt(report['mia_auc'])}",
            f"- exposure (bits, {report['candidates']} candidates; chance ≈ {report['exposure_chance_bits']:.2f}, "
            f"max {report['exposure_max_bits']:.2f}): inserted {_fmt(report['exposure_inserted_mean'])}, "
            f"held out {_fmt(report['exposure_held_out_mean'])}",
            "",
        ]
    )


def _plot(path: Path, drawn, score: list[float]) -> None:
    """PNG histogram of member and non-member scores."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist([s for s, c in zip(score, drawn, strict=True) if c.inserted], bins=20, alpha=0.6, label="inserted")
    ax.hist([s for s, c in zip(score, drawn, strict=True) if not c.inserted], bins=20, alpha=0.6, label="held out")
    ax.set_xlabel("score: base loss − adapter loss (nats/token)")
    ax.set_ylabel("canaries")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
