"""``dplora audit``: parses arguments and calls :mod:`dplora.audit.runner`; exit 5 when the bound exceeds ε."""

from pathlib import Path
from typing import Annotated

import typer

AUDIT_VIOLATION_EXIT = 5


def register(app: typer.Typer, *, config_arg, overrides_arg, fail, log, out) -> None:
    """Add the ``audit`` command to ``app`` (the CLI's argument types and error handling passed in)."""

    @app.command(short_help="Canary audit: one-run ε lower bound, exposure and MIA AUC (exit 5 on a violation).")
    def audit(
        config: config_arg,
        overrides: overrides_arg = None,
        canaries: Annotated[int, typer.Option(metavar="M", help="Canaries, each its own protected unit.")] = 100,
        copies: Annotated[
            int, typer.Option(metavar="K", help="Records per canary inside its unit (ticket/user level only).")
        ] = 1,
        candidates: Annotated[int, typer.Option(metavar="N", help="Random secrets for exposure.")] = 1000,
        guesses: Annotated[
            int | None, typer.Option(metavar="K", help="Guesses on each side (k₊ = k₋). Default: canaries // 4.")
        ] = None,
        data_source: Annotated[
            str,
            typer.Option(
                metavar="private|public|surrogate", help="What the data is; no-DP baselines need non-private."
            ),
        ] = "private",
        audit_dir: Annotated[
            Path | None, typer.Option("--out", metavar="DIR", help="Audit folder. Default: <output_dir>-audit.")
        ] = None,
        plot: Annotated[
            bool, typer.Option("--plot", help="Write a PNG histogram of member/non-member scores.")
        ] = False,
        overwrite: Annotated[bool, typer.Option(help="Replace a previous audit's run folder.")] = False,
        ledger: Annotated[
            Path | None, typer.Option(metavar="PATH", help="Budget ledger (privacy.population): charged as by train.")
        ] = None,
        attach: Annotated[
            Path | None,
            typer.Option(
                metavar="RUN_DIR",
                help="Add the results as an `audit` section to this release's record and re-sign it (same mechanism).",
            ),
        ] = None,
        signing_key: Annotated[
            Path | None,
            typer.Option(
                metavar="PATH", help="With --attach: the release's Ed25519 key. Default: $DPLORA_SIGNING_KEY."
            ),
        ] = None,
        threads: Annotated[int | None, typer.Option(min=1, metavar="N", help="CPU threads.")] = None,
        progress: Annotated[bool, typer.Option(help="Report training progress on stderr.")] = True,
    ) -> None:
        """Insert canaries with probability 1/2, train exactly as `dplora train`, score and bound ε from below.

        Writes <audit>/audit.json and audit.md; exit 5 when the lower bound exceeds the claimed ε. With --attach,
        the results are signed into the release's record (the audit must run the release's mechanism).
        """
        from dplora.audit import attach as attaching
        from dplora.audit.runner import REPORT_FILENAME, AuditOptions, DataSource, run_audit, summary_markdown
        from dplora.contract.spec import load_contract
        from dplora.errors import BadInputError, DploraError

        pinned: list[str] = []
        try:
            try:
                source = DataSource(data_source)
            except ValueError:
                raise BadInputError(f"--data-source={data_source!r}: use private, public or surrogate") from None
            first = load_contract(config, overrides or [])
            folder = audit_dir or Path(f"{first.training.output_dir}-audit")
            target = None
            if attach is not None:
                _separate(folder, attach)
                target = attaching.open_release(attach, signing_key)
                pinned = attaching.pin_overrides(first, target)
            elif signing_key is not None:
                raise BadInputError("--signing-key signs an attached audit: give --attach RUN_DIR too")
            contract = load_contract(config, [*(overrides or []), *pinned, f"training.output_dir={folder / 'run'}"])
            if target is not None:
                attaching.check_plan(contract, target)
                if pinned:
                    log(f"attach: the audit declares the release's N ({pinned[0]}), so q, T and σ are the release's")
            options = AuditOptions(
                canaries=canaries,
                copies=copies,
                candidates=candidates,
                guesses=guesses,
                data_source=source,
                plot=plot,
            )
            report = run_audit(
                contract,
                options,
                audit_dir=folder,
                train_kwargs={
                    "overwrite": overwrite,
                    "threads": threads,
                    "progress": progress,
                    "ledger_path": ledger,
                    "contract_path": config,
                },
                log=log,
            )
            if target is not None:
                from dplora.release.envelope import sha256_file

                data_files = [contract.data.path.rsplit("/", 1)[-1]]
                section = attaching.audit_section(report, sha256_file(folder / REPORT_FILENAME), data_files)
                envelope = attaching.attach(target, section)
                attaching.record_in_ledger(target, envelope, ledger, log)
        except DploraError as err:
            raise fail(err) from None
        out.print(summary_markdown(report), markup=False, soft_wrap=True)
        out.print(f"audit: {folder / REPORT_FILENAME}", markup=False)
        if target is not None:
            out.print(f"attached to the release record: {envelope}", markup=False)
        if report["violation"]:
            raise typer.Exit(code=AUDIT_VIOLATION_EXIT)


def _separate(audit_folder: Path, run_dir: Path) -> None:
    """Refuse an audit folder inside the release (an unsigned file there fails verify) or the release inside it."""
    from dplora.errors import BadInputError

    a, r = audit_folder.resolve(), run_dir.resolve()
    if a.is_relative_to(r) or r.is_relative_to(a):
        raise BadInputError(f"--attach {run_dir}: the audit folder {audit_folder} must lie outside the release folder")
