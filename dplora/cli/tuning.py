"""``dplora clip-guide`` and ``dplora sweep``: parse arguments, call :mod:`dplora.tuning.clipguide` or
:mod:`dplora.tuning.sweep`."""

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from dplora.cli.common import fail, log, out
from dplora.cli.options import (
    ConfigArg,
    JsonLinesOpt,
    OverridesArg,
    TrainingProgressOpt,
    TuningThreadsOpt,
    data_key_option,
    json_option,
    ledger_option,
    signing_key_option,
)
from dplora.contract.choices import ProtectedUnit
from dplora.errors import BadInputError, DploraError
from dplora.surface import PREFIX, echo_private


def _emit(doc: dict) -> None:
    typer.echo(json.dumps(doc, indent=2, ensure_ascii=True, allow_nan=False))


ClipPublicOpt = Annotated[
    Path | None,
    typer.Option(metavar="FILE", help="A file you declare public (contract columns). Default: demo tickets."),
]
ClipSampleOpt = Annotated[int, typer.Option(min=1, max=100000, metavar="N", help="Units to measure.")]


def clip_guide(
    config: ConfigArg,
    overrides: OverridesArg = None,
    public: ClipPublicOpt = None,
    sample: ClipSampleOpt = 256,
    threads: TuningThreadsOpt = None,
    as_json: JsonLinesOpt = False,
) -> None:
    """Gradient norm of each protected unit (its summed gradient at ticket/user level, as the engine clips it)
    for the base model with the contract's LoRA initialisation, on a PUBLIC sample: --public FILE, or the demo
    generator. Prints quantiles, suggests C = the median (Andrew et al. 2021, adaptive clipping) and the share
    of units the contract's C would clip. LoRA B starts at zero, so grad A is 0 at init: the norms come from
    grad B. The contract's own data is never read (that would need a DP quantile charged to the ledger).
    """
    from dplora.contract.loader import load_contract
    from dplora.data import public as public_data
    from dplora.tuning import clipguide

    try:
        with contextlib.redirect_stdout(sys.stderr):
            contract = load_contract(config, overrides or [])
            user_level = contract.privacy.protected_unit is ProtectedUnit.USER
            tickets = sample * 5 if user_level else sample  # 1-5 tickets per customer: at least `sample` of them
            table, source = public_data.public_table(
                contract.data, contract.privacy, public, num_tickets=tickets, option="--public", units=True
            )
            if public is None:
                log(f"note: no --public FILE: measuring on the {source}")
            guide = clipguide.clip_guide(contract, table, source, sample=sample, threads=threads, log=log)
    except DploraError as err:
        raise fail(err, as_json=as_json) from None
    if as_json:
        _emit({"ok": True, **guide.to_dict()})
        return
    for line in clipguide.report_lines(guide):
        out.print(line, markup=False, soft_wrap=True)


SweepGridArg = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="KEY=V1,V2",
        help="Grid axes (KEY=V1,V2,...) and fixed overrides (KEY=VALUE), e.g. training.lr=1e-3,3e-3.",
        show_default=False,
    ),
]
SweepOutDirOpt = Annotated[Path, typer.Option("--out", metavar="DIR", help="Sweep folder (new or empty).")]
SweepEvalPublicOpt = Annotated[
    Path | None, typer.Option(metavar="FILE", help="Pick on this file, which you declare public.")
]
SweepEvalPrivateOpt = Annotated[
    Path | None, typer.Option(metavar="FILE", help="Pick on a private file: the record says the choice is NOT covered.")
]
SweepEvalContractOpt = Annotated[
    bool,
    typer.Option("--eval-contract", help="Pick on the contract's held-out set (covered only if data.eval_public)."),
]
SweepEvalTicketsOpt = Annotated[
    int, typer.Option(min=1, max=100000, metavar="N", help="Demo tickets for the default public set.")
]
SweepSigningKeyOpt = Annotated[Path | None, signing_key_option("Ed25519 key that signs the one release.")]
SweepDataKeyOpt = Annotated[
    Path | None, data_key_option("Data owner's key for the keyed data digest.", says_default=False)
]
SweepLedgerOpt = Annotated[Path | None, ledger_option(default=None)]
SweepAsJsonOpt = Annotated[bool, json_option("one JSON summary on stdout.")]


def sweep(
    config: ConfigArg,
    grid: SweepGridArg = None,
    out_dir: SweepOutDirOpt = ...,
    eval_public: SweepEvalPublicOpt = None,
    eval_private: SweepEvalPrivateOpt = None,
    eval_contract: SweepEvalContractOpt = False,
    eval_tickets: SweepEvalTicketsOpt = 200,
    signing_key: SweepSigningKeyOpt = None,
    data_key: SweepDataKeyOpt = None,
    ledger: SweepLedgerOpt = None,
    threads: TuningThreadsOpt = None,
    progress: TrainingProgressOpt = True,
    as_json: SweepAsJsonOpt = False,
) -> None:
    """Run every trial of the grid exactly as `dplora train`, each charged to the ledger as a tuning trial
    (privacy.population required), pick the lowest held-out loss on a public set (default: demo tickets), and
    sign the chosen trial's release with a `tuning` entry: every trial's (ε, δ) and their composed total
    (basic composition, and the accountant's where it applies; the smaller is stated). Other trials' adapters
    are deleted, never released. Picking on private data marks the record NOT COVERED.
    """
    import signal

    from dplora.tuning.sweep import SelectBy, SweepOptions, run_sweep

    def _terminate(signum, _frame):  # as train: SIGTERM stops the current trial like Ctrl-C (checkpoint, exit 130)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _terminate)

    try:
        select_by, eval_file = _selection(eval_public, eval_private, eval_contract)
        options = SweepOptions(
            out_dir=out_dir,
            select_by=select_by,
            eval_file=eval_file,
            eval_tickets=eval_tickets,
            signing_key=signing_key,
            data_key=data_key,
            ledger_path=ledger,
            threads=threads,
            progress=progress,
            contract_path=config,
        )
        if select_by is SelectBy.DEMO:
            log("note: no --eval-public FILE: trials are compared on demo tickets (public by construction)")

        private_log = (lambda m: log(PREFIX + m)) if echo_private(as_json=as_json) else None
        with contextlib.redirect_stdout(sys.stderr):
            result = run_sweep(config, grid or [], options, log=log, private_log=private_log)
    except DploraError as err:
        raise fail(err, as_json=as_json) from None
    _report(result, as_json=as_json)


def _selection(eval_public: Path | None, eval_private: Path | None, eval_contract: bool):
    """(how the sweep picks its trial, the file it picks on): at most one of the three options; default demo."""
    from dplora.tuning.sweep import SelectBy

    chosen = [(SelectBy.PUBLIC, eval_public), (SelectBy.PRIVATE, eval_private)]
    chosen = [(s, f) for s, f in chosen if f is not None]
    chosen += [(SelectBy.CONTRACT, None)] if eval_contract else []
    if len(chosen) > 1:
        raise BadInputError("give at most one of --eval-public, --eval-private, --eval-contract")
    return chosen[0] if chosen else (SelectBy.DEMO, None)


def _report(result, *, as_json: bool) -> None:
    """The trials charged, the chosen trial and the total ε; the release folder on stdout (or ``--json``)."""
    t = result.tuning
    if as_json:
        _emit({"ok": True, "release": str(result.release_dir), "tuning": t})
        return
    log(
        f"sweep: {t['trials']} trials charged; chosen trial {t['selection']['chosen_trial']}; total "
        f"ε={t['total_epsilon']:.4f}, δ={t['total_delta']:g} ({t['composition']}); {t['statement']}"
    )
    out.print(f"release: {result.release_dir}", markup=False)


def register(app: typer.Typer) -> None:
    """Add ``clip-guide`` and ``sweep`` to ``app``, in this order."""
    app.command("clip-guide", short_help="Per-unit gradient norms on a public sample; suggests C (the median).")(
        clip_guide
    )
    app.command(short_help="A charged grid of train runs; releases the best on a public eval with the total ε.")(sweep)
