"""``dplora audit``: parses arguments and calls :mod:`dplora.audit.runner`; exit 5 when the bound exceeds ε."""

from pathlib import Path
from typing import Annotated

import typer

from dplora.cli.common import fail, log, out
from dplora.cli.options import ConfigArg, OverridesArg, TrainingProgressOpt

AUDIT_VIOLATION_EXIT = 5


CanariesOpt = Annotated[int, typer.Option(metavar="M", help="Canaries, each its own protected unit.")]
CopiesOpt = Annotated[
    int, typer.Option(metavar="K", help="Records per canary inside its unit (ticket/user level only).")
]
CandidatesOpt = Annotated[int, typer.Option(metavar="N", help="Random secrets for exposure.")]
GuessesOpt = Annotated[
    int | None, typer.Option(metavar="K", help="Guesses on each side (k₊ = k₋). Default: canaries // 4.")
]
DataSourceOpt = Annotated[
    str, typer.Option(metavar="private|public|surrogate", help="What the data is; no-DP baselines need non-private.")
]
AuditDirOpt = Annotated[
    Path | None, typer.Option("--out", metavar="DIR", help="Audit folder. Default: <output_dir>-audit.")
]
PlotOpt = Annotated[bool, typer.Option("--plot", help="Write a PNG histogram of member/non-member scores.")]
OverwriteOpt = Annotated[bool, typer.Option(help="Replace a previous audit's run folder.")]
LedgerOpt = Annotated[
    Path | None, typer.Option(metavar="PATH", help="Budget ledger (privacy.population): charged as by train.")
]
AttachOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="RUN_DIR",
        help="Add the results as an `audit` section to this release's record and re-sign it (same mechanism).",
    ),
]
SigningKeyOpt = Annotated[
    Path | None,
    typer.Option(metavar="PATH", help="With --attach: the release's Ed25519 key. Default: $DPLORA_SIGNING_KEY."),
]
AuditThreadsOpt = Annotated[int | None, typer.Option(min=1, metavar="N", help="CPU threads.")]


def audit(
    config: ConfigArg,
    overrides: OverridesArg = None,
    canaries: CanariesOpt = 100,
    copies: CopiesOpt = 1,
    candidates: CandidatesOpt = 1000,
    guesses: GuessesOpt = None,
    data_source: DataSourceOpt = "private",
    audit_dir: AuditDirOpt = None,
    plot: PlotOpt = False,
    overwrite: OverwriteOpt = False,
    ledger: LedgerOpt = None,
    attach: AttachOpt = None,
    signing_key: SigningKeyOpt = None,
    threads: AuditThreadsOpt = None,
    progress: TrainingProgressOpt = True,
) -> None:
    """Insert canaries with probability 1/2, train exactly as `dplora train`, score and bound ε from below.

    Writes <audit>/audit.json and audit.md; exit 5 when the lower bound exceeds the claimed ε. With --attach,
    the results are signed into the release's record (the audit must run the release's mechanism).
    """
    from dplora.audit.runner import REPORT_FILENAME, AuditOptions, run_audit, summary_markdown
    from dplora.errors import DploraError

    envelope = None
    try:
        contract, source, folder, target = _prepare(
            config, overrides or [], data_source, audit_dir, attach, signing_key
        )
        options = AuditOptions(
            canaries=canaries,
            copies=copies,
            candidates=candidates,
            guesses=guesses,
            data_source=source,
            plot=plot,
        )
        train_kwargs = {
            "overwrite": overwrite,
            "threads": threads,
            "progress": progress,
            "ledger_path": ledger,
            "contract_path": config,
        }
        report = run_audit(contract, options, audit_dir=folder, train_kwargs=train_kwargs, log=log)
        if target is not None:
            envelope = _attach(target, report, contract, folder, ledger)
    except DploraError as err:
        raise fail(err) from None
    out.print(summary_markdown(report), markup=False, soft_wrap=True)
    out.print(f"audit: {folder / REPORT_FILENAME}", markup=False)
    if target is not None:
        out.print(f"attached to the release record: {envelope}", markup=False)
    if report["violation"]:
        raise typer.Exit(code=AUDIT_VIOLATION_EXIT)


def _prepare(config: Path, overrides: list[str], data_source: str, audit_dir, attach, signing_key):
    """(the audit's contract, its data source, its folder, the release to attach to or None), checked before
    training: with --attach the release verifies and the audit's plan is the release's mechanism; planner ``auto``
    values are resolved as train resolves them (:func:`dplora.recipe.planning.resolve_auto`)."""
    from dplora.audit import attach as attaching
    from dplora.audit.runner import DataSource
    from dplora.contract.loader import load_contract, replace_overrides
    from dplora.errors import BadInputError
    from dplora.recipe.planning import resolve_auto

    pinned: list[str] = []
    try:
        source = DataSource(data_source)
    except ValueError:
        raise BadInputError(f"--data-source={data_source!r}: use private, public or surrogate") from None
    first = load_contract(config, overrides)
    folder = audit_dir or Path(f"{first.training.output_dir}-audit")
    target = None
    if attach is not None:
        _separate(folder, attach)
        target = attaching.open_release(attach, signing_key)
        pinned = attaching.pin_overrides(first, target)
    elif signing_key is not None:
        raise BadInputError("--signing-key signs an attached audit: give --attach RUN_DIR too")
    contract = load_contract(config, replace_overrides(overrides, [*pinned, f"training.output_dir={folder / 'run'}"]))
    # training.expected_batch_size / steps: auto: B, T and lr from the planner, as train resolves them, before
    # the attach check plans the mechanism and the audit trains and reports it
    contract, _ = resolve_auto(contract)
    if target is not None:
        attaching.check_plan(contract, target)
        if pinned:
            log(f"attach: the audit declares the release's N ({pinned[0]}), so q, T and σ are the release's")
    return contract, source, folder, target


def _attach(target, report: dict, contract, folder: Path, ledger: Path | None) -> Path:
    """Sign the finished audit into the release's record and note it in the ledger; the new envelope's path."""
    from dplora.audit import attach as attaching
    from dplora.audit.runner import REPORT_FILENAME
    from dplora.release.envelope import sha256_file

    data_files = [contract.data.path.rsplit("/", 1)[-1]]
    section = attaching.audit_section(report, sha256_file(folder / REPORT_FILENAME), data_files)
    envelope = attaching.attach(target, section)
    attaching.record_in_ledger(target, envelope, ledger, log)
    return envelope


def register(app: typer.Typer) -> None:
    """Add ``audit`` to ``app``, in this order."""
    app.command(short_help="Canary audit: one-run ε lower bound, exposure and MIA AUC (exit 5 on a violation).")(audit)


def _separate(audit_folder: Path, run_dir: Path) -> None:
    """Refuse an audit folder inside the release (an unsigned file there fails verify) or the release inside it."""
    from dplora.errors import BadInputError

    a, r = audit_folder.resolve(), run_dir.resolve()
    if a.is_relative_to(r) or r.is_relative_to(a):
        raise BadInputError(f"--attach {run_dir}: the audit folder {audit_folder} must lie outside the release folder")
