"""Resuming a run, and stopping one cleanly: what ``--resume`` checks, which ``.partial`` folders a new run may
replace, and the one-line messages of a failed or interrupted run (what happened, how to resume).

A resume must continue the same DP mechanism: the contract (except performance settings), the data and the plan
must be the ones the checkpoint was written under, or the accountant history would describe another mechanism.
A ``.partial`` folder that holds a resume checkpoint or a FAILED.json is never deleted without ``--overwrite``.
"""

from __future__ import annotations

import errno
import math
from pathlib import Path

import yaml

from dplora.atomic import DiskFullError
from dplora.errors import BadInputError, DploraError, NoisyUpdateError, TrainingFailedError
from dplora.run import outputs
from dplora.run.checkpoint import (
    CHECKPOINT_FILENAME,
    CheckpointInfo,
    CheckpointUnreadableError,
    data_sha256,
    read_info,
    remove_stale,
)
from dplora.run.execution import utc_now

# Settings that may change on --resume: they change neither the DP mechanism nor the accounting.
RESUMABLE_CHANGES = (
    "training.threads",
    "training.physical_batch_size",
    "training.checkpoint_every",
    "training.sharding",  # where the base weights live: a run out of memory under none goes on under fsdp
)


# A checkpoint written before data.chat_template existed tokenized prompt/response records raw (``none``).
PRE_TEMPLATE_DEFAULTS = {
    "data.record_format": "auto",
    "data.messages_column": None,
    "data.train_on": "assistant",
    "data.chat_template": "none",
}


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            out |= _flat(value, f"{prefix}{key}.")
        return out
    return {prefix[:-1]: node}


def check_resumable(info: CheckpointInfo, contract_yaml: str, data_path: str, plan, unit_index, digest: str) -> None:
    """Refuse to resume a checkpoint under another contract, other data or another plan, naming what changed.

    Args:
        info: The checkpoint read from the staging folder.
        contract_yaml: The contract as it is now, in its canonical YAML (``Contract.to_yaml``).
        data_path: The contract's data file (``data.path``), named in the error.
        plan: The plan as it is now (:class:`dplora.plan.training.TrainingPlan`).
        unit_index: The data's unit index (its record and unit counts are compared, never shown).
        digest: sha256 of the data file now.

    Raises:
        BadInputError: one line naming the changed keys, the data file, or the plan values.
    """
    before = _flat(yaml.safe_load(info.meta["contract_yaml"]))
    for key, value in PRE_TEMPLATE_DEFAULTS.items():  # a checkpoint from before these keys tokenized this way
        before.setdefault(key, value)
    now = _flat(yaml.safe_load(contract_yaml))
    changed = [k for k in sorted(before.keys() | now.keys()) if before.get(k) != now.get(k)]
    changed = [k for k in changed if k not in RESUMABLE_CHANGES]
    if changed:
        shown = ", ".join(f"{k} ({before.get(k)!r} → {now.get(k)!r})" for k in changed[:4])
        raise BadInputError(
            f"--resume: the contract changed since the checkpoint: {shown}; resume needs the same contract "
            f"(only {', '.join(RESUMABLE_CHANGES)} may change)"
        )
    data = info.meta["data"]
    if data["sha256"] != digest or (data["num_records"], data["num_units"]) != (
        unit_index.num_records,
        unit_index.num_units,
    ):
        raise BadInputError(
            f"--resume: the data changed since the checkpoint: {data_path} differs from the file the run "
            "started on (its sha256 or its records); resume needs the same data"  # no counts: they are private
        )
    saved = info.meta["plan"]
    keys = ("steps", "sample_rate", "noise_multiplier", "accountant", "delta", "max_grad_norm", "num_units")
    now_plan = plan.to_dict()
    diff = [f"{k} ({saved.get(k)!r} → {now_plan[k]!r})" for k in keys if saved.get(k) != now_plan[k]]
    if diff:
        raise BadInputError(f"--resume: the plan changed since the checkpoint: {', '.join(diff)}")
    history = info.meta["accountant_history"]
    if any((float(s), float(q)) != (plan.noise_multiplier, plan.sample_rate) for s, q, _ in history):
        raise BadInputError(f"--resume: checkpoint {info.path} accounts steps at another (σ, q) than the plan")
    if info.step > plan.steps:
        raise BadInputError(f"--resume: checkpoint {info.path} holds more steps than the planned T")


def steps_run(staging: Path, info: CheckpointInfo | None) -> int:
    """Logical steps whose outputs the run in ``staging`` made public in any way: its checkpoint's step, or, when
    it stopped by the DP stop rule (FAILED.json ``stopped_on_dp_output``: a non-finite parameter after a noisy
    update), the steps it took. That stop is a function of the noisy updates of every step taken, past the last
    checkpoint too, so those steps are charged (a run that stops at step k is charged k steps).

    A run killed or interrupted between checkpoints is different: its later steps' outputs were lost unseen (the
    kill does not read them; the log shows only the plan's numbers), so redoing them from the checkpoint with fresh
    noise and sampling releases nothing more, and the run stays resumable."""
    import json

    steps = info.step if info is not None else 0
    try:
        failed = json.loads((staging / "FAILED.json").read_text())
    except (OSError, ValueError):
        return steps
    if isinstance(failed, dict) and failed.get("stopped_on_dp_output") is True:
        done = failed.get("steps_done")
        if isinstance(done, int) and not isinstance(done, bool):
            steps = max(steps, done)
    return steps


def resume_point(staging: Path, contract_yaml: str, data, plan, unit_index) -> tuple[CheckpointInfo, str]:
    """For ``--resume``: the checkpoint to continue from and the data digest, after every check.

    ``contract_yaml`` is the contract now (``Contract.to_yaml``), ``data`` its data section
    (:class:`dplora.contract.spec.DataSection`); see :func:`check_resumable`.

    A run stopped by the DP stop rule after steps past its last checkpoint is not resumed (:func:`steps_run`): those
    steps are charged, and redoing them would spend more than the one charge reserved for T steps; ``--overwrite``
    settles it at its reserved ε and starts a new run.

    Raises:
        BadInputError: no checkpoint, an unreadable one, steps past it, or a changed contract, data or plan
            (exit 2).
    """
    try:
        info = read_info(staging)
    except CheckpointUnreadableError as err:
        raise BadInputError(f"--resume: {err}; it cannot be resumed") from None
    if info is None:
        raise BadInputError(f"--resume: no resume checkpoint in {staging}; run without --resume to start a new run")
    if (ran := steps_run(staging, info)) > info.step:
        raise BadInputError(
            f"--resume: run {info.run_id} took {ran} steps but its last checkpoint holds {info.step}, and it stopped "
            "on a non-finite noisy update (a DP output of those steps): they stay charged, so redoing them would "
            "spend more than the run's charge; pass --overwrite to settle it at its reserved ε and start a new run"
        )
    digest = data_sha256(data)
    check_resumable(info, contract_yaml, data.path, plan, unit_index, digest)
    return info, digest


def prepare_staging(out: Path, *, resuming: bool, overwrite: bool, on_discard, log) -> Path:
    """Make ``<output_dir>.partial`` ready and return it: kept when resuming, else a fresh one, never silently.

    A folder holding a resume checkpoint or a FAILED.json is replaced only with ``--overwrite``; its run's
    pending ledger charge is then settled as failed at the ε of the checkpoint's steps (``on_discard(checkpoint,
    ran=steps run)``, the run's charge object: :meth:`dplora.recipe.train.RunCharge.settle_discarded`).

    Raises:
        BadInputError: such a folder without ``--overwrite`` (exit 2; nothing is touched), or see
            :func:`dplora.run.outputs.fresh_staging`.
    """
    staging = outputs.staging_path(out)
    if resuming:
        remove_stale(staging)
        return staging
    if staging.is_dir():
        try:
            info, unreadable = read_info(staging), None
        except CheckpointUnreadableError as err:
            info, unreadable = None, str(err)
        failed = (staging / "FAILED.json").is_file()
        if failed and info is None and not unreadable and _setup_failure_only(staging):
            log(f"note: replacing {staging}: it holds only an earlier run's setup failure (no step, no checkpoint)")
            failed = False
        if (info is not None or unreadable or failed) and not overwrite:
            what = (
                f"a resume checkpoint of run {info.run_id}: finish it with --resume, or pass --overwrite to discard it"
                if info is not None
                else "an earlier run's FAILED.json and checkpoint files: read them, then pass --overwrite to replace "
                "them"
            )
            raise BadInputError(f"{staging} holds {what}")
        if info is not None:
            on_discard(info, ran=steps_run(staging, info))
    return outputs.fresh_staging(out)


SETUP_STAGE = "setup"  # FAILED.json's "stage" of a run that failed before step 0 work and its ledger charge
TRAINING_STAGE = "training"  # FAILED.json's "stage" of a run that failed after its charge was reserved


def _setup_failure_only(staging: Path) -> bool:
    """``staging`` holds a FAILED.json of a setup failure (stage ``setup``, no step done) and no checkpoint files."""
    import json

    try:
        entry = json.loads((staging / "FAILED.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(entry, dict) or entry.get("stage") != SETUP_STAGE or entry.get("steps_done") != 0:
        return False
    return not any(p.name.startswith(CHECKPOINT_FILENAME.split(".")[0]) for p in staging.rglob("*"))


def _what_happened(err: BaseException) -> tuple[str, str]:
    """(what happened, extra resume advice) in one line, never with training text and never with the step reached.

    The step a run reached when it was stopped by a signal or failed without reading a DP output is a function of
    wall-clock time and of the realised (private) batches: it is left out of every public line. Only the DP stop
    rule (:class:`dplora.errors.NoisyUpdateError`, a DP output) names its step.
    """
    import torch

    cuda_oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    if isinstance(err, cuda_oom | MemoryError):
        kind = "accelerator" if isinstance(err, cuda_oom) else "host"
        return f"out of {kind} memory during training", " with a smaller training.physical_batch_size"
    if isinstance(err, DiskFullError):  # names the file and the bytes needed vs free
        return str(err), " once there is free space"
    if isinstance(err, OSError):
        where = f" ({err.filename})" if err.filename else ""
        if err.errno == errno.ENOSPC:
            return f"disk full{where}", " once there is free space"
        return f"{err.strerror or err.__class__.__name__}{where}", ""
    if isinstance(err, TrainingFailedError | NoisyUpdateError):
        return str(err), ""
    return f"training failed: {err.__class__.__name__}", ""


def failure_line(err: BaseException, spec, state, last: CheckpointInfo | None) -> str:
    """The one-line exit-4 message: what happened, where the last checkpoint is, and how to resume."""
    what, advice = _what_happened(err)
    return f"{what}; no release was written; {resume_hint(spec, last, advice)}"


def follower_failure_line(err: BaseException, state, rank: int) -> str:
    """The one-line exit-4 message of a rank other than 0 whose own part of a step failed: what happened (never
    training text); rank 0, which the step's reduction told, writes FAILED.json and keeps the resume checkpoint."""
    return f"{_what_happened(err)[0]} on rank {rank}; no release was written; rank 0 writes FAILED.json"


def resume_hint(spec, last: CheckpointInfo | None, advice: str = "") -> str:
    """How to go on from here, in words (the ledger charge of a resumable run stays pending)."""
    if last is None:
        return f"no resume checkpoint was written: see {spec.staging / 'FAILED.json'}"
    charge = f"; its ledger charge stays pending until then (or `dplora ledger settle {spec.run_id}`)"
    return f"a resume checkpoint is in {spec.staging}: rerun the same command with --resume{advice}" + (
        charge if spec.config.charged else ""
    )


def failure_entries(spec, state, err: BaseException, last: CheckpointInfo | None) -> tuple[dict, dict]:
    """FAILED.json of a run that failed in training: (the public entry, the private one).

    The public entry (``<output_dir>.partial/FAILED.json``, which a CI job may show) names the stage, the planned T,
    the reserved ε and a one-line reason without the step reached. The steps done, ε after them, the resume
    checkpoint's step and the failure time are a function of wall-clock time and the realised batches: they go to
    the private entry (``<output_dir>.partial/private/FAILED.json``). A stop by the DP stop rule
    (:class:`dplora.errors.NoisyUpdateError`) read DP outputs of the steps it took, which stay charged: its public
    entry keeps ``steps_done`` and ε after them.
    """
    plan, accounted = spec.plan, state.accountant.steps
    dp_stop = isinstance(err, NoisyUpdateError)
    # Steps done are the logical steps that completed (state.step is set only after a step returns); a failure inside
    # a step's optimizer update (after its noise was drawn and the accountant stepped) leaves that step undone. The
    # charge stays an upper bound: the accountant's count, which includes that step's noisy sum.
    done, spent = min(state.step, accounted), plan.epsilon_spent(accounted)
    if isinstance(err, KeyboardInterrupt):
        reason = f"interrupted ({err.args[0] if err.args else 'Ctrl-C'})"
    else:
        reason = _what_happened(err)[0]
    public = {
        "run_id": spec.run_id,
        "stage": TRAINING_STAGE,
        "steps_planned": plan.steps,
        "epsilon_reserved": _finite(plan.epsilon),
        "reason": reason,
        "stopped_on_dp_output": dp_stop,  # the stop rule read DP outputs: those steps stay charged
        "resume": "rerun the same `dplora train` command with --resume" if last is not None else None,
        "release": "none (run failed)",
    }
    if dp_stop:
        public |= {"steps_done": done, "epsilon_charged_upper_bound": _finite(spent)}
    private = {
        "note": "private diagnostics, computed on the private data and NOT covered by DP: never publish",
        "run_id": spec.run_id,
        "steps_done": done,
        "steps_planned": plan.steps,
        "epsilon_spent_upper_bound": _finite(spent),
        "time": utc_now(),
        "reason": _failure_reason(err),
        "resume_checkpoint": None
        if last is None
        else {"file": last.path.name, "step": last.step, "epsilon_upper": last.meta["epsilon_upper"]},
    }
    return public, private


def setup_failure_entry(err: BaseException, planned: int) -> dict:
    """FAILED.json of a run that failed in set-up, before step 0 work and its ledger charge (no step, no ε)."""
    return {
        "run_id": None,
        "stage": SETUP_STAGE,
        "steps_done": 0,
        "steps_planned": planned,
        "epsilon_charged_upper_bound": 0.0,
        "reason": _failure_reason(err),
        "stopped_on_dp_output": False,
        "release": "none (run failed)",
    }


def _finite(epsilon: float):
    """ε for a JSON file: the number, or words for a non-private control's ∞."""
    return epsilon if math.isfinite(epsilon) else "infinite (non-private control)"


def _failure_reason(err: BaseException) -> str:
    """One line for FAILED.json: a DploraError's message, "SIGTERM" (the CLI's handler names it), or the class."""
    if isinstance(err, DploraError):
        return str(err)
    if isinstance(err, KeyboardInterrupt) and err.args:
        return str(err.args[0])
    return err.__class__.__name__
