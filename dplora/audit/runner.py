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
from dplora.audit.summary import summary_markdown
from dplora.errors import BadInputError
from dplora.recipe.config import RunOptions
from dplora.run.outputs import fix_mtimes

REPORT_FILENAME = "audit.json"
SUMMARY_FILENAME = "audit.md"
PLOT_FILENAME = "audit_scores.png"
TPR_KEYS = ("fpr", "tpr", "true_positives", "inserted", "false_positives")  # the power check's measured points


class DataSource(str, enum.Enum):
    """What the audited data is: the baseline without DP runs only on public or surrogate (demo) data."""

    PRIVATE = "private"
    PUBLIC = "public"
    SURROGATE = "surrogate"


# --power-data is refused only when it is the private file itself (path or file identity): a content comparison
# would be an equality oracle on the private file, so a copy passes, and the report says what that means
POWER_DATA_NOTE = (
    "declared public by the caller; dplora refuses only the private file itself (same path or file) and never "
    "compares contents: a copy of private data declared public voids the guarantee (this run has no noise, and its "
    "numbers are in this report and in any release it is attached to)"
)


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


def check_options(privacy, options: AuditOptions) -> None:
    """Refuse what the audit cannot do (exit 2).

    Raises:
        BadInputError: a non-private baseline on private data, copies at row level, too few canaries or
            guesses out of range.
    """
    from dplora.plan.resolve import is_control

    if is_control(privacy) and options.data_source is DataSource.PRIVATE:
        raise BadInputError(
            "privacy.enabled=false audits run only on public or surrogate data (e.g. dplora demo-data): "
            "pass --data-source surrogate or public"
        )
    if options.canaries < 4:
        raise BadInputError(f"--canaries={options.canaries}: give at least 4")
    if options.copies > 1 and privacy.unit_key is None:
        raise BadInputError(f"--copies={options.copies}: a row-level canary is one row; copies need a unit key")
    k = options.guesses if options.guesses is not None else options.canaries // 4
    if not 1 <= 2 * k <= options.canaries:
        raise BadInputError(f"--guesses={k}: need 1 <= 2·guesses <= canaries={options.canaries}")
    if options.candidates < 1:
        raise BadInputError(f"--candidates={options.candidates}: give at least 1")


def run_audit(
    contract,
    options: AuditOptions,
    *,
    audit_dir: Path,
    run_options: RunOptions,
    log=print,
    power_contract=None,
    power_source: DataSource | None = None,
) -> dict:
    """Insert canaries, train as ``dplora train`` does, score them and write ``audit.json`` and ``audit.md``.

    Args:
        contract: the validated contract whose ``training.output_dir`` is ``<audit_dir>/run``.
        options: :class:`AuditOptions`.
        audit_dir: the audit's folder (created).
        run_options: the training options (:class:`dplora.recipe.config.RunOptions`: threads, progress,
            contract_path, ...); the audit sets the signing key (its own, thrown away), no data key and the canaries.
        power_contract: for the power check, a non-private control contract (``privacy.enabled: false``, no
            population) on PUBLIC or surrogate data only (:func:`check_power_contract`), output in
            ``<audit_dir>/power-run``: the same inserted canaries go through it and the report says how near the
            audit's ε̂ ceiling it gets. None: no power check.
        power_source: what the power check's data is (public or surrogate).

    Returns:
        The report (a dict, as written to ``audit.json``).

    Raises:
        BadInputError, PlanRefusedError, TrainingFailedError: from training (no report is written).
    """
    from dplora.recipe.train import run_training
    from dplora.release.keys import generate_keypair

    check_options(contract.privacy, options)
    audit_dir.mkdir(parents=True, exist_ok=True)
    drawn = canaries.make_canaries(options.canaries)
    extra = [
        row
        for c in drawn
        if c.inserted
        for row in canaries.canary_rows(contract.data, contract.privacy.unit_key, c.unit_id, c.secret, options.copies)
    ]
    key, _ = generate_keypair(audit_dir / "audit-run.key", overwrite=True)  # the audit run's own, thrown away
    try:
        opts = dataclasses.replace(run_options, signing_key=key, data_key=None, extra_records=tuple(extra))
        result = run_training(contract, opts, log=log)
    finally:
        key.unlink(missing_ok=True)
    measured = _score(result.output_dir, contract, drawn, options, run_options.threads, log)
    report = _report(result, contract.privacy, drawn, measured, options)
    if power_contract is not None:
        report["power_check"] = _power_check(power_contract, power_source, drawn, options, audit_dir, run_options, log)
    atomic.write_json(audit_dir / REPORT_FILENAME, report, sort_keys=False)
    atomic.write_text(audit_dir / SUMMARY_FILENAME, summary_markdown(report))
    if options.plot:
        _plot(audit_dir / PLOT_FILENAME, drawn, measured["score"])
    _stamp_reports(audit_dir, result)
    return report


def check_power_contract(power_contract, source: DataSource | None) -> None:
    """Refuse a power check that is not a non-private control on public or surrogate data (exit 2).

    Raises:
        BadInputError: DP still on, a ledger population set, or data declared private.
    """
    from dplora.plan.resolve import is_control

    if source not in (DataSource.PUBLIC, DataSource.SURROGATE):
        raise BadInputError(
            "the power check trains without noise: it runs on public or surrogate data only, never the private data"
        )
    if not is_control(power_contract.privacy) or power_contract.privacy.population:
        raise BadInputError("the power check's contract must be a control (privacy.enabled=false, no population)")


def _power_check(power_contract, source, drawn, options: AuditOptions, audit_dir: Path, run_options, log) -> dict:
    """The same inserted canaries through a run without noise on public data: how near the ε̂ ceiling it gets."""
    from dplora.audit import power
    from dplora.recipe.train import run_training
    from dplora.release.keys import generate_keypair

    check_power_contract(power_contract, source)
    extra = [
        row
        for c in drawn
        if c.inserted
        for row in canaries.canary_rows(
            power_contract.data, power_contract.privacy.unit_key, c.unit_id, c.secret, options.copies
        )
    ]
    key, _ = generate_keypair(audit_dir / "power-run.key", overwrite=True)
    # a control without population is never charged: no ledger
    opts = dataclasses.replace(
        run_options, signing_key=key, data_key=None, extra_records=tuple(extra), ledger_path=None
    )
    try:
        result = run_training(power_contract, opts, log=log)
    finally:
        key.unlink(missing_ok=True)
    measured = _score(result.output_dir, power_contract, drawn, options, run_options.threads, log)
    m = len(drawn)
    k = options.guesses if options.guesses is not None else m // 4
    inserted = [c.inserted for c in drawn]
    r, v = bound.count_correct(measured["score"], inserted, k_in=k, k_out=k)
    delta = result.plan.delta
    lower = bound.epsilon_lower_bound(m=m, r=r, v=v, delta=delta, confidence=options.confidence)
    ceiling = power.bound_ceiling(m=m, r=r, delta=delta, confidence=options.confidence)
    members = [s for s, i in zip(measured["score"], inserted, strict=True) if i]
    others = [s for s, i in zip(measured["score"], inserted, strict=True) if not i]
    points = power.ceiling_comparison(measured["score"], inserted, None, confidence=options.confidence)["points"]
    return {
        "what": "the same canaries through a run without clipping or noise (privacy.enabled=false) on public data",
        "data_source": source.value,
        **({"data_note": POWER_DATA_NOTE} if source is DataSource.PUBLIC else {}),
        "run_folder": str(result.output_dir),
        "run_id": result.run_id,
        "steps": result.steps_done,
        "guesses": r,
        "correct": v,
        "epsilon_lower_bound": lower,
        "epsilon_lower_bound_ceiling": ceiling,
        "fraction_of_ceiling": lower / ceiling if ceiling > 0 else 0.0,
        "mia_auc": scores.auc(members, others) if members and others else None,
        "tpr_at": [{key: p[key] for key in TPR_KEYS} for p in points],
    }


def _stamp_reports(audit_dir: Path, result) -> None:
    """The audit's report files carry its run's ``started_at`` (taken before the data was read), not the time they
    were written: that would time the private audit run."""
    from dplora.release.read import read_statement

    statement = read_statement(Path(result.release_path)) if result.release_path else None
    started = (statement or {}).get("predicate", {}).get("started_at")
    if started:
        fix_mtimes(audit_dir, started)  # the reports, the audit run's folders and the audit folder itself


def _score(run_folder: Path, contract, drawn, options: AuditOptions, threads, log) -> dict:
    """Per canary: adapter loss, base loss, score = base − adapter; exposure against random candidates."""
    import datasets

    from dplora.data.tokens import tokenize_records
    from dplora.release.read import load_adapter_model, read_run

    model, tokenizer, device = load_adapter_model(read_run(run_folder), threads=threads, log=log)
    kw = {"pad_id": tokenizer.pad_token_id, "device": device, "batch_size": contract.training.fixed_physical_batch_size}

    def examples(secrets_: list[str]):
        rows = [
            canaries.canary_rows(contract.data, contract.privacy.unit_key, f"c{i}", s)[0]
            for i, s in enumerate(secrets_)
        ]
        return tokenize_records(
            datasets.Dataset.from_list(rows), tokenizer, contract.data, max_seq_len=contract.training.max_seq_len
        )

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


def _report(result, privacy, drawn, measured: dict, options: AuditOptions) -> dict:
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
    from dplora.audit import power

    info = power.informativeness(m=m, r=r, delta=plan.delta, claimed_epsilon=claimed, confidence=options.confidence)
    event = plan.event if result.differentially_private else None
    versus = power.ceiling_comparison(measured["score"], inserted, event, confidence=options.confidence)
    bound_violation = lower > claimed
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
        "violation": bound_violation or versus["exceeded"],
        "verdict": power.verdict(
            bound_violation=bound_violation, ceiling_exceeded=versus["exceeded"], informative=info["informative"]
        ),
        "bound_violation": bound_violation,
        "epsilon_lower_bound_ceiling": info["epsilon_lower_bound_ceiling"],
        "epsilon_lower_bound_ceiling_delta0": info["epsilon_lower_bound_ceiling_delta0"],
        "informative": info["informative"],
        "uninformative_reasons": info["reasons"],
        "ceiling_exceeded": versus["exceeded"],
        "tpr_vs_ceiling": versus["points"],
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
        "mechanism": mechanism_of(plan, privacy) if result.differentially_private else None,
        "ledger": _ledger_entry(result, privacy),
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


def _ledger_entry(result, privacy) -> dict:
    """Whether the audit's run was charged to the ledger, as ``dplora train`` charges: every DP run (under its
    population, else as an unassigned run) and a non-private control only on a population."""
    population = privacy.population
    charged = population is not None or result.differentially_private
    return {
        "charged": charged,
        "population": population,
        "unassigned": charged and population is None,
        "run_id": result.run_id if charged else None,
        "epsilon": (result.epsilon_spent if result.differentially_private else "infinite") if charged else None,
        "delta": result.plan.delta if charged else None,
    }


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
