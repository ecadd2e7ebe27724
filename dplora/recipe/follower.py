"""A rank other than 0 of a multi-process run: the same gates, engine and steps as rank 0 on its shard of the units;
it writes nothing (no staging folder, ledger, checkpoint or release) and reports nothing. Apart from
:class:`dplora.recipe.train.DPLoRARecipe` so that rank 0's recipe has no branch for it (torchtune keeps its
distributed recipe apart the same way).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dplora.contract.spec import DataSection
from dplora.engine import distributed
from dplora.errors import DploraError, TrainingFailedError
from dplora.mechanism import reduction
from dplora.recipe.build import build_run
from dplora.recipe.config import RunResult
from dplora.run import loop, resume
from dplora.run.config import RunConfig
from dplora.run.progress import ProgressReporter


def follow(config: RunConfig, data: DataSection, table, unit_index, *, out: Path, io):
    """Run this rank's part of every step in lockstep with rank 0.

    Args:
        config: the compiled run (rank 0's plan, broadcast); data: the data spec (``contract.data``).
        table, unit_index: this rank's copy of the training records and their units (compared across ranks).
        out: the output folder (never written here); io: the run's :class:`dplora.recipe.train.RunIO`.
    Returns:
        :class:`dplora.recipe.config.RunResult` without a release path.
    Raises:
        DploraError: this rank's failure or, through a gate or the step's reduction, another rank's.
    """
    with distributed.gate(config.world):  # rank 0 reads a resume checkpoint and checks the ledger here
        pass
    with distributed.gate(config.world):  # rank 0 also restores a resume checkpoint here
        spec, state = build_run(
            config, data, table, unit_index, out=out, staging=None, log=io.log, private=io.private,
            warm=not io.options.resume,
        )  # fmt: skip
    distributed.sync_state(config.world, state)  # rank 0's LoRA tensors, optimizer state and step counts
    t0, first_step = time.perf_counter(), state.step
    signals = reduction.FollowerSignals(state.optimizer.reducer)
    with open(os.devnull, "w") as metrics, ProgressReporter(enabled=False) as bar, signals:
        try:
            loop.run_steps(spec, state, metrics=metrics, progress=bar, after_step=signals.after_step)
        except Exception as err:
            if isinstance(err, DploraError):
                raise
            # this rank's own failure (the reduction re-raises it here): one line and exit 4, as on rank 0
            raise TrainingFailedError(resume.follower_failure_line(err, state, config.world.rank)) from err
    loop.check_accounted(spec, state)
    seconds = time.perf_counter() - t0
    plan = config.plan
    return RunResult(
        output_dir=out,
        release_path=None,
        plan=plan,
        steps_done=state.step,
        empty_steps=state.empty_steps,
        epsilon_spent=plan.epsilon_at(state.step),
        seconds=seconds,
        seconds_per_step=seconds / max(plan.steps - first_step, 1),
        threads=spec.threads,
    )
