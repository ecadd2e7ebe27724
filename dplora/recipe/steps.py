"""Running the built run: the loop of T logical steps (:func:`dplora.run.loop.run_steps`, where the DP step reads top
to bottom), the checks after it (every planned step taken and accounted), the held-out evaluation and the release.
"""

from __future__ import annotations

import json
import time

from dplora import atomic
from dplora.engine import distributed
from dplora.errors import TrainingFailedError
from dplora.evaluate.report import report_lines
from dplora.mechanism import control
from dplora.recipe.finish import (
    metrics_path,
    open_metrics,
    reset_peak_memory,
    write_outputs,
)
from dplora.recipe.setup import (
    RunIO,
)
from dplora.run.loop import sharded_base
from dplora.run.outputs import private_staging
from dplora.run.progress import BatchReporter, ProgressReporter
from dplora.run.tracking import TrackedMetrics, Tracker


def train_and_release(spec, state, *, io: RunIO, started: str, checkpointer):
    """Run every planned step, check the accounting, evaluate on the held-out set if any, then write the adapters
    and the signed release.

    Returns:
        (evaluation, train_seconds, eval_seconds): the :class:`dplora.evaluate.heldout.Evaluation` or None, the
        wall seconds of the loop of steps alone and of the held-out evaluation alone (0.0 without one).
    """
    from dplora.run.loop import run_steps

    tracker = _tracker(spec, started)
    try:
        with (
            open_metrics(spec.staging, state.step, _metrics_header(spec)) as metrics,
            ProgressReporter(enabled=io.progress) as bar,
            checkpointer,
        ):
            bar.start(spec.plan.steps)
            checkpointer.write()  # before step 1 (skipped when resuming from this step)
            logged = metrics if tracker is None else TrackedMetrics(metrics, tracker)
            reset_peak_memory(spec.device)  # the peak reported is the steps', not the probe's (set-up)
            t0 = time.perf_counter()
            run_steps(spec, state, metrics=logged, progress=bar, after_step=_after_step(state, checkpointer))
            train_seconds = time.perf_counter() - t0
        ranks = check_accounted(spec, state)
        t0 = time.perf_counter()
        evaluation = _evaluate_held_out(spec, state, io)
        eval_seconds = time.perf_counter() - t0 if evaluation is not None else 0.0
        if tracker is not None and evaluation is not None and not evaluation.public:
            tracker.log_private(_eval_scalars(evaluation), step=state.step)
    finally:
        if tracker is not None:
            tracker.close()
    epsilon_spent = spec.plan.epsilon_at(state.step)
    write_outputs(spec, state, started=started, epsilon_spent=epsilon_spent, io=io, ranks=ranks, evaluation=evaluation)
    return evaluation, train_seconds, eval_seconds


def _tracker(spec, started: str | None = None):
    """The run's :class:`dplora.run.tracking.Tracker` (``training.report_to``), or None for ``none``."""
    training = spec.contract.training
    if getattr(training.report_to, "value", training.report_to) == "none":
        return None
    return Tracker(
        training.report_to,
        plan=spec.plan,
        out=spec.out,
        private_dir=private_staging(spec.staging),
        run_id=spec.run_id,
        report_private=training.report_private,
        started=started,
    )


def _eval_scalars(evaluation) -> dict[str, float]:
    """The held-out evaluation's top-level numbers (private: logged only with ``training.report_private``)."""
    flat = {}
    for key, value in evaluation.to_dict().items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[f"eval/{key}"] = float(value)
    return flat


def _evaluate_held_out(spec, state, io: RunIO):
    """Base vs adapters on the held-out set (None without one); logs the numbers labelled, never held-out text.

    Private held-out numbers go to the private ``metrics.jsonl`` (:func:`metrics_path`) under ``not_covered_by_dp``
    only, never into the release folder; the caller puts them in the
    record only when the set is declared public. With W processes rank 0 evaluates alone, after the last step.
    """
    if spec.held_out is None:
        return None
    if sharded_base(spec) and spec.world.distributed:  # rank 0 cannot forward alone
        io.log(
            "held-out evaluation: skipped under training.sharding: fsdp with several processes (every forward is "
            f"collective); run `dplora eval {spec.out}` on the release"
        )
        return None
    from dplora.engine.perexample import unwrap
    from dplora.evaluate.heldout import evaluate_model, held_out_source

    source, public = held_out_source(spec.contract.data)
    with BatchReporter("held-out eval", enabled=io.progress, public=public) as progress:  # the operator's terminal
        evaluation = evaluate_model(
            unwrap(state.model),
            spec.tokenizer,
            spec.held_out,
            spec.contract.data,
            spec.contract.training,
            device=spec.device,
            source=source,
            public=public,
            private_run=not control.is_control(spec.contract.privacy),
            progress=progress,
        )
    for line in report_lines(evaluation):  # numbers on a private held-out set are private diagnostics
        (io.log if public else io.private)(line)
    with metrics_path(spec.staging).open("a") as metrics:
        entry = {"eval": evaluation.to_dict()}
        atomic.append_line(metrics, json.dumps(entry if public else {"not_covered_by_dp": entry}))
    return evaluation


def _metrics_header(spec) -> dict:
    """The first line of ``metrics.jsonl``; a non-private control's also says it carries no DP guarantee."""
    from dplora.run.loop import METRICS_HEADER

    if control.is_control(spec.contract.privacy):
        return {**METRICS_HEADER, "non_private": control.NO_DP_STATEMENT}
    return METRICS_HEADER


def _after_step(state, checkpointer):
    """Rank 0's hook after each step: the checkpointer's; with W processes a signal on any rank (seen in the
    step's reduction) stops every rank after the same step, rank 0 with a resume checkpoint."""
    reducer = getattr(state.optimizer, "reducer", None)
    if reducer is None:
        return checkpointer.after_step
    reducer.stop_requested = lambda: checkpointer.stopping

    def after_step(spec, state) -> None:
        if reducer.totals.get("stop"):
            checkpointer.request_stop("SIGTERM or SIGINT on another rank")
        checkpointer.after_step(spec, state)

    return after_step


def check_accounted(spec, state) -> list[dict] | None:
    """Every planned step taken and accounted; with W processes, on every rank, with identical adapters.

    Returns:
        With W processes, each rank's accountant steps and adapter digest (for the record); else None.

    Raises:
        TrainingFailedError: a step count differs from the plan, or the ranks disagree (no release).
    """
    if state.accountant.steps != spec.plan.steps or state.step != spec.plan.steps:  # never release unaccounted
        raise TrainingFailedError(f"accounted {state.accountant.steps} steps, planned {spec.plan.steps}: no release")
    if not spec.world.distributed:
        return None
    from dplora.engine.perexample import unwrap

    model = unwrap(state.model)
    digest = distributed.adapter_digest(model)
    held = None
    if sharded_base(spec):  # each rank's share of the base, counted from its shards
        from dplora.engine.sharding import local_base_parameters

        held = local_base_parameters(model)[0]
    return distributed.check_agreement(spec.world, steps=state.accountant.steps, digest=digest, base_parameters=held)
