"""``dplora audit``: parses arguments and calls :mod:`dplora.audit.runner`; exit 5 when the bound exceeds ε."""

from pathlib import Path
from typing import Annotated

import typer

from dplora.cli.common import fail, log, out
from dplora.cli.options import (
    ConfigArg,
    OverridesArg,
    ReleaseDataKeyOpt,
    ReleaseDataOpt,
    ReleaseModelOpt,
    TrainingProgressOpt,
    ledger_option,
    overwrite_option,
    signing_key_option,
    threads_option,
)
from dplora.contract.labels import same_file
from dplora.data.digest import sha256_file
from dplora.errors import BadInputError, DploraError
from dplora.recipe.config import RunOptions

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
OverwriteOpt = Annotated[bool, overwrite_option("a previous audit's run folder")]
LedgerOpt = Annotated[
    Path | None, ledger_option("Budget ledger (privacy.population): charged as by train.", default=None)
]
AttachOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="RUN_DIR",
        help="Add the results as an `audit` section to this release's record and re-sign it (same mechanism).",
    ),
]
SigningKeyOpt = Annotated[Path | None, signing_key_option("With --attach: the release's Ed25519 key.")]
PowerCheckOpt = Annotated[
    bool,
    typer.Option(
        "--power-check",
        help="Also train the same canaries without noise on public data (never private) and report how near "
        "the audit's ceiling that gets.",
    ),
]
PowerDataOpt = Annotated[
    Path | None,
    typer.Option(metavar="FILE", help="Public or surrogate data for --power-check (default: the audit's own data, "
                 "when --data-source is public or surrogate)."),
]  # fmt: skip
AuditThreadsOpt = Annotated[int | None, threads_option(says_default=False)]


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
    power_check: PowerCheckOpt = False,
    power_data: PowerDataOpt = None,
    data: ReleaseDataOpt = None,
    model: ReleaseModelOpt = None,
    data_key: ReleaseDataKeyOpt = None,
) -> None:
    """Insert canaries with probability 1/2, train exactly as `dplora train`, score and bound ε from below.

    Writes <audit>/audit.json and audit.md; exit 5 when the lower bound exceeds the claimed ε or a measured TPR
    exceeds the release's attack ceiling beyond its confidence interval; fewer than 1,000 canaries report
    "uninformative", not a pass. With --attach, the results are signed into the release's record (the audit must
    run the release's mechanism). --power-check also trains the same canaries without noise on public data.
    With --attach, the release's data and base model are found as eval finds them (a relative path from here, else
    from the release folder's parent); --data and --model stand in for a moved release's files.
    """
    from dplora.audit.runner import REPORT_FILENAME, AuditOptions, run_audit
    from dplora.audit.summary import summary_markdown
    from dplora.release.locate import ReleaseInputs

    envelope = None
    try:
        inputs = ReleaseInputs(data=data, model=model, data_key=data_key)
        contract, source, folder, target, data_name = prepare_audit(
            config, overrides or [], data_source, audit_dir, attach, signing_key, inputs
        )
        options = AuditOptions(
            canaries=canaries,
            copies=copies,
            candidates=candidates,
            guesses=guesses,
            data_source=source,
            plot=plot,
        )
        run_options = RunOptions(
            overwrite=overwrite, threads=threads, progress=progress, ledger_path=ledger, contract_path=config
        )
        power = power_contract(config, overrides or [], contract, source, folder, power_check, power_data)
        report = run_audit(
            contract,
            options,
            audit_dir=folder,
            run_options=run_options,
            log=log,
            power_contract=power[0] if power else None,
            power_source=power[1] if power else None,
        )
        if target is not None:
            envelope = _attach(target, report, contract, folder, ledger, data_name)
    except DploraError as err:
        raise fail(err) from None
    out.print(summary_markdown(report), markup=False, soft_wrap=True)
    out.print(f"audit: {folder / REPORT_FILENAME}", markup=False)
    if target is not None:
        out.print(f"attached to the release record: {envelope}", markup=False)
    if report["violation"]:
        raise typer.Exit(code=AUDIT_VIOLATION_EXIT)


def prepare_audit(
    config: Path, overrides: list[str], data_source: str, audit_dir, attach, signing_key, inputs=None
):  # fmt: skip
    """(the audit's contract, its :class:`~dplora.audit.runner.DataSource`, its folder, the release to attach to or
    None, the data file's name as the release trained on it or None), checked before training: with --attach the
    release verifies, its data and base model are found where it now is
    (:func:`dplora.audit.attach.moved_release_files`; ``inputs``: ``--data``, ``--model``, ``--data-key``) and the
    audit's plan is the release's mechanism; planner ``auto`` values are resolved as train resolves them
    (:func:`dplora.plan.resolve.resolve_auto`). The audit trains in ``<folder>/run``; ``folder`` is
    ``audit_dir`` or ``<output_dir>-audit``.

    Raises:
        BadInputError: an unknown ``data_source``, ``--signing-key`` without ``--attach``, ``--data`` or ``--model``
            without ``--attach``, an audit folder inside the release (or the release inside it), a moved release's
            file not found or not the recorded one, or a contract that does not load (exit 2).
        BadInputError: from :func:`dplora.audit.attach.open_release` and :func:`dplora.audit.attach.check_plan`:
            no key, a release that does not verify, or an audit plan that differs from the release's mechanism.
        PlanRefusedError: the audit's plan is refused (planning).
    """
    from dplora.audit import attach as attaching
    from dplora.audit.runner import DataSource
    from dplora.contract.loader import load_contract, replace_overrides
    from dplora.plan.resolve import resolve_auto

    pinned: list[str] = []
    moved = None
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
        pinned = attaching.pin_overrides(first.privacy, target)
        if inputs is not None:
            moved = attaching.moved_release_files(first, target, inputs, log)
    elif signing_key is not None:
        raise BadInputError("--signing-key signs an attached audit: give --attach RUN_DIR too")
    elif inputs is not None and (inputs.data is not None or inputs.model is not None):
        raise BadInputError(
            "--data and --model stand in for the files of the release given with --attach RUN_DIR; without one, "
            "name the audit's files in the contract (data.path=FILE model.path=PATH)"
        )
    located = moved.overrides if moved is not None else []
    output_dir = f"training.output_dir={folder / 'run'}"
    contract = load_contract(config, replace_overrides(overrides, [*pinned, *located, output_dir]))
    # training.expected_batch_size / steps: auto: B, T and lr from the planner, as train resolves them, before
    # the attach check plans the mechanism and the audit trains and reports it
    contract, _ = resolve_auto(contract)
    if target is not None:
        attaching.check_plan(contract, target)
        if pinned:
            log(f"attach: the audit declares the release's N ({pinned[0]}), so q, T and σ are the release's")
    return contract, source, folder, target, (moved.data_name if moved is not None else None)


def power_contract(config: Path, overrides: list[str], contract, source, folder: Path, wanted: bool, data):
    """(the power check's control contract, its data source), or None without --power-check; checked before any
    training. Its data is --power-data (public or surrogate, declared by the user) or the audit's own data when
    that is public or surrogate; never the audit's private data file.

    Raises:
        BadInputError: --power-data without --power-check, a private audit without --power-data, or --power-data
            naming the private data file (by resolved path or file identity, never by content).
    """
    from dplora.audit.runner import DataSource, check_power_contract
    from dplora.contract.loader import load_contract, replace_overrides
    from dplora.plan.resolve import resolve_auto

    if data is not None and not wanted:
        raise BadInputError("--power-data is the public data of --power-check: give --power-check too")
    if not wanted:
        return None
    if data is None and source is DataSource.PRIVATE:
        raise BadInputError(
            "--power-check trains without noise, so never on the private data: pass --power-data FILE (public or "
            "surrogate data with the same columns) or audit with --data-source public|surrogate"
        )
    if data is not None:
        if not Path(data).is_file():
            raise BadInputError(f"--power-data {data}: no such file")
        # by path and file identity only, never contents: a content match would make the exit code say whether the
        # private file equals a file the caller chose (an equality oracle on the private data); a copy declared
        # public is the caller's declaration, which the audit report says voids the guarantee
        if source is DataSource.PRIVATE and same_file(Path(data), Path(contract.data.path)):
            raise BadInputError("--power-data is the audit's private data file: the power check needs public data")
    power_source = DataSource.PUBLIC if data is not None else source
    pinned = [
        "privacy.enabled=false",
        "privacy.population=null",
        f"training.output_dir={folder / 'power-run'}",
        *([f"data.path={Path(data).resolve()}"] if data is not None else [f"data.path={contract.data.path}"]),
        f"privacy.num_units={contract.privacy.num_units}" if contract.privacy.num_units else "",
        f"training.expected_batch_size={contract.training.expected_batch_size}",
        f"training.steps={contract.training.steps}",
        f"training.lr={contract.training.lr}",
    ]
    power, _ = resolve_auto(load_contract(config, replace_overrides(overrides, [p for p in pinned if p])))
    check_power_contract(power, power_source)
    return power, power_source


def _attach(target, report: dict, contract, folder: Path, ledger: Path | None, data_name: str | None = None) -> Path:
    """Sign the finished audit into the release's record and note it in the ledger; the new envelope's path.
    ``data_name``: the release's data file's name as trained, when the audit read it where the release now is (a
    given file's own name is never recorded)."""
    from dplora.audit import attach as attaching
    from dplora.audit.runner import REPORT_FILENAME

    data_files = [data_name or contract.data.path.rsplit("/", 1)[-1]]
    section = attaching.audit_section(report, sha256_file(folder / REPORT_FILENAME), data_files)
    envelope = attaching.attach(target, section)
    attaching.record_in_ledger(target, envelope, ledger, log)
    return envelope


def register(app: typer.Typer) -> None:
    """Add ``audit`` to ``app``, in this order."""
    app.command(short_help="Canary audit: one-run ε lower bound, exposure and MIA AUC (exit 5 on a violation).")(audit)


def _separate(audit_folder: Path, run_dir: Path) -> None:
    """Refuse an audit folder inside the release (an unsigned file there fails verify) or the release inside it."""
    a, r = audit_folder.resolve(), run_dir.resolve()
    if a.is_relative_to(r) or r.is_relative_to(a):
        raise BadInputError(f"--attach {run_dir}: the audit folder {audit_folder} must lie outside the release folder")
