"""``dplora budget`` and ``dplora train``: parse the contract and options, call the library, report."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from dplora.cli import budget_view
from dplora.cli.common import console, emit_json, error_doc, fail, log, out, quiet_worker
from dplora.cli.options import (
    MOST_THREADS,
    ConfigArg,
    LedgerOpt,
    OverridesArg,
    data_key_option,
    json_option,
    overwrite_option,
    progress_option,
    show_private_option,
    signing_key_option,
    threads_option,
)
from dplora.errors import BadInputError, DploraError, one_line
from dplora.recipe.config import RunOptions
from dplora.run import outputs
from dplora.run.outputs import private_path
from dplora.run.progress import duration
from dplora.surface import LOG_FILENAME, PrivateLog, echo_private, private_notice

BudgetAsJsonOpt = Annotated[bool, json_option("one JSON object instead of tables.")]
BudgetPlotOpt = Annotated[
    Path | None, typer.Option(metavar="PNG", help="Write ε against steps to this PNG (matplotlib).")
]
BudgetSweepOpt = Annotated[bool, typer.Option(help="Also show σ for a few batch sizes and epochs (RDP).")]
BudgetWorldSizeOpt = Annotated[
    int, typer.Option(min=1, metavar="W", help="Processes of a multi-process run: units per rank per step.")
]

BudgetRecommendOpt = Annotated[
    bool, typer.Option(help="Let the planner choose B, T and lr from public inputs (declared N); no data read.")
]
BudgetEstimateOpt = Annotated[
    bool,
    typer.Option(
        "--estimate",
        help="Also load the model and time one synthetic step (max_seq_len tokens, no data): a public time estimate "
        "for the run from the plan's T and B.",
    ),
]
BudgetMaxStepsOpt = Annotated[
    int | None, typer.Option(min=1, max=1_000_000, metavar="T", help="With --recommend: cap on logical steps T.")
]
BudgetTimeOpt = Annotated[
    str | None,
    typer.Option(
        "--time-budget",
        metavar="DURATION",
        help="Load the model, time one synthetic step (no data) and print the epochs that fit this wall-clock "
        "budget (45m, 2h, 1h30m) as training.epochs; with --recommend or an auto contract the planner uses them.",
    ),
]
BudgetEpochsOpt = Annotated[
    float | None, typer.Option(min=0.001, max=1e6, metavar="E", help="With --recommend: epochs over units (default 3).")
]


ShowPrivateOpt = Annotated[
    bool,
    show_private_option(
        "Also print the private diagnostics (timings, counts, held-out numbers; NOT covered by DP) on stderr "
        "under CI, without a terminal or with --json. They are always in <output_dir>.private/.",
    ),
]


def budget(
    config: ConfigArg,
    overrides: OverridesArg = None,
    as_json: BudgetAsJsonOpt = False,
    plot: BudgetPlotOpt = None,
    sweep: BudgetSweepOpt = False,
    ledger: LedgerOpt = None,
    world_size: BudgetWorldSizeOpt = 1,
    recommend: BudgetRecommendOpt = False,
    max_steps: BudgetMaxStepsOpt = None,
    epochs: BudgetEpochsOpt = None,
    show_private: ShowPrivateOpt = False,
    estimate: BudgetEstimateOpt = False,
    time_budget: BudgetTimeOpt = None,
) -> None:
    """Dry run: plan N, q, T and σ and report ε, without loading a model (--estimate loads it to time a step).

    N comes from privacy.num_units if declared, else from counting protected units in the data. Under CI, without a
    terminal or with --json the report is public: no records-per-unit statistics or data-count warnings, and no plan
    on a counted private N (--show-private shows them).
    """
    from dplora.tuning import budget as budget_mod

    private = echo_private(as_json=as_json, show_private=show_private, stream=sys.stdout)
    t0 = time.perf_counter()
    if plot is not None and plot.suffix.lower() != ".png":
        raise fail(BadInputError(f"--plot {plot}: the plot is a PNG file; use a name ending in .png"), as_json=as_json)
    try:
        report = budget_mod.budget_report(
            config,
            overrides or [],
            ledger_path=ledger,
            sweep=sweep,
            world_size=world_size,
            recommend=recommend,
            epochs=epochs,
            max_steps=max_steps,
            show_private=private,
            estimate=estimate,
            time_budget=time_budget,
            log=log,
        )
        if plot is not None:
            budget_mod.plot_curve(report, plot)
    except DploraError as err:
        raise fail(err, as_json=as_json) from None
    if private:  # the planning time includes reading the data: a private diagnostic
        report["seconds"] = round(time.perf_counter() - t0, 3)
    if as_json:
        emit_json({"ok": True, **report})
    else:
        budget_view.print_report(report, out, warn=console)  # warnings on stderr, as train prints them
    if not private:  # on every such run, whether or not the data gave anything to withhold
        log(private_notice("not printed here", "records per unit, data-count warnings, planning time"))


SigningKeyOpt = Annotated[Path | None, signing_key_option("Ed25519 private key (PEM) that signs the release.")]
DataKeyOpt = Annotated[Path | None, data_key_option("Data owner's key for the keyed data digest (HMAC-SHA256).")]
OverwriteOpt = Annotated[
    bool, overwrite_option("a previous dplora run's output folder (never another folder) once the run succeeds")
]
TrainThreadsOpt = Annotated[int | None, threads_option(most=MOST_THREADS)]
ProgressOpt = Annotated[
    bool,
    progress_option(
        "Report progress on stderr: a bar on a terminal, else a plain line every ⌈T/10⌉ steps (public values only)."
    ),
]
TuningTrialOpt = Annotated[
    bool, typer.Option(help="Charge the ledger as a hyperparameter-tuning trial: it spends budget like a release.")
]
ResumeOpt = Annotated[
    bool, typer.Option(help="Continue from the resume checkpoint in <output_dir>.partial (same contract and data).")
]
NonPrivateOpt = Annotated[
    bool,
    typer.Option(
        "--non-private",
        help="Allow a privacy.enabled=false control on a ledger population; the ledger records it as ε=∞.",
    ),
]
NOT_STARTED = "training had not started, nothing was written"

AsJsonOpt = Annotated[bool, json_option("one JSON summary on stdout (progress and messages stay on stderr).")]


def train(
    config: ConfigArg,
    overrides: OverridesArg = None,
    signing_key: SigningKeyOpt = None,
    data_key: DataKeyOpt = None,
    overwrite: OverwriteOpt = False,
    ledger: LedgerOpt = None,
    threads: TrainThreadsOpt = None,
    progress: ProgressOpt = True,
    tuning_trial: TuningTrialOpt = False,
    resume: ResumeOpt = False,
    non_private: NonPrivateOpt = False,
    as_json: AsJsonOpt = False,
    show_private: ShowPrivateOpt = False,
) -> None:
    """Fine-tune LoRA adapters with DP-SGD under the contract and write a signed release.

    What it prints on stdout and, under CI or without a terminal, on stderr is public: a function of the contract,
    the plan and DP outputs only. Private diagnostics go to <output_dir>.private/ (train.log, report.json).
    """
    private_log = PrivateLog(log if echo_private(as_json=as_json, show_private=show_private) else None)

    options = RunOptions(
        signing_key=signing_key,
        data_key=data_key,
        overwrite=overwrite,
        ledger_path=ledger,
        threads=threads,
        progress=progress,
        tuning_trial=tuning_trial,
        non_private=non_private,
        contract_path=config,
        resume=resume,
    )
    result = _run(config, overrides or [], options, as_json=as_json, private_log=private_log)
    if result.release_path is not None:  # None on a rank other than 0 of a multi-process run: rank 0 reports
        _report(result, as_json=as_json, private_log=private_log)


def _run(config: Path, overrides: list[str], options, *, as_json: bool, private_log=None):
    """Load the contract and run it (:func:`dplora.api.load`, :func:`dplora.api.run`: the Python API's code path);
    errors and Ctrl-C/SIGTERM as exits."""
    import contextlib
    import signal

    from dplora import api

    def _terminate(signum, _frame):  # SIGTERM (CI cancel) is handled like Ctrl-C: FAILED.json, ledger settled
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _terminate)
    started = time.time()
    output_dir = None
    try:
        # stdout is kept for the final line or JSON document: anything a library prints during the run goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            contract = api.load(config, overrides)  # the Python API's code path (dplora.train)
            output_dir = contract.training.output_dir
            return api.run(contract, options, log=log, private_log=private_log)
    except DploraError as err:
        # Exiting anyway: a launcher's SIGTERM now (torchrun stops the other processes once one exited) ends the
        # process by the default action, never as a KeyboardInterrupt traceback through this handler.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise fail(err, as_json=as_json) from None
    except KeyboardInterrupt as err:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        message = _interrupted_message(err, output_dir, since=started)
        if not (message.endswith(NOT_STARTED) and quiet_worker()):  # a launcher stopping its other processes
            log(message)  # after the first one's bad input: that one's line says why
        if as_json:
            emit_json(error_doc(130, one_line(message.removeprefix("error: "))))
        raise typer.Exit(code=130) from None


def _report(result, *, as_json: bool, private_log) -> None:
    """The finished run's lines on stderr and its release path (or ``--json`` summary) on stdout.

    The public ``done:`` line holds the plan's numbers and ε only; the realised empty steps and wall times are
    private diagnostics (``private_log``).
    """
    p = result.plan
    private_log(
        f"{result.empty_steps} of {p.steps} steps had an empty Poisson batch, {result.seconds_per_step:.2f} s/step"
        f"{_eval_time(result)}"
    )
    if not result.differentially_private:
        from dplora.mechanism.control import NO_DP_STATEMENT

        log(f"done: {result.steps_done}/{p.steps} steps, {_threads(result.threads)}; {NO_DP_STATEMENT}")
        if as_json:
            emit_json(_train_summary(result))
        else:
            out.print(f"non-private record (no DP guarantee): {result.release_path}", markup=False)
        _private_line(result, private_log)
        return
    log(
        f"done: {result.steps_done}/{p.steps} steps, ε={result.epsilon_spent:.4f} "
        f"≤ {p.target_epsilon:g} at δ={p.delta:g} ({p.accountant.value}), {_threads(result.threads)}"
    )
    if as_json:
        emit_json(_train_summary(result))
    else:
        out.print(f"release: {result.release_path}", markup=False)
    _private_line(result, private_log)


def _threads(count: int) -> str:
    return f"{count} thread" if count == 1 else f"{count} threads"


def _private_line(result, private_log) -> None:
    """Where the private diagnostics are. Off a terminal the same fixed line on every run, whether or not anything
    was withheld (its presence must not depend on the data); on a terminal, where they were printed, the folder."""
    folder = private_path(result.output_dir)
    if private_log.echoing:
        log(f"private (not covered by DP; keep local, never ship): {folder}")
    else:
        log(private_notice(str(folder / LOG_FILENAME)))


def _eval_time(result) -> str:
    """The held-out evaluation's wall time for the private line (the s/step there is training alone)."""
    if result.evaluation is None:
        return ""

    return f", held-out eval {duration(result.eval_seconds)}"


def _train_summary(result) -> dict:
    """``train --json``: the run's summary from :func:`dplora.release.report.train_summary` (the one writer of
    the record, the card and this summary)."""
    return result.summary


def _interrupted_message(err: KeyboardInterrupt, output_dir: str | None, *, since: float) -> str:
    """One line for Ctrl-C / SIGTERM: the signal, and this run's FAILED.json if the run got that far."""
    what = str(err.args[0]) if err.args else "Ctrl-C"
    if what.startswith("interrupted ("):  # the run's own line: the signal, FAILED.json, how to resume
        return f"error: {what}"
    message = f"error: interrupted ({what}); no release was written"
    if output_dir is not None:
        failed = outputs.staging_path(outputs.output_path(output_dir)) / outputs.FAILED_FILENAME
        if failed.is_file() and failed.stat().st_mtime >= since - 1:
            return f"{message}; see {failed}"
    return f"{message}; {NOT_STARTED}"
