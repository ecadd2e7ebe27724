"""How a run ends: its metrics file, the failure record (FAILED.json, the ledger entry) and the outputs of a finished
run (adapters, record, card, signed release).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from dplora import atomic
from dplora.data.chat import tokenization_entry
from dplora.engine.lora import adapted_module_names
from dplora.errors import DploraError, NoisyUpdateError
from dplora.mechanism import control
from dplora.recipe.setup import RunIO, write_json
from dplora.release import envelope as release
from dplora.release.record import build_record, non_private_record, warm_start_entry
from dplora.run import outputs
from dplora.run.execution import execution_entry, utc_now
from dplora.run.resume import failure_fields


def metrics_path(staging: Path) -> Path:
    """The run's per-step log, ``<output_dir>.partial/private/metrics.jsonl`` (published as
    ``<output_dir>.private/metrics.jsonl``, beside the release and never in it): realised units and records,
    losses and step times are computed on private data and not covered by ε. A ``.partial`` folder from before
    the private folder existed has its ``metrics.jsonl`` moved there."""
    private = outputs.private_staging(staging)
    path = private / outputs.METRICS_FILENAME
    legacy = Path(staging) / outputs.METRICS_FILENAME
    if legacy.is_file() and not path.is_file():
        legacy.rename(path)
    return path


def open_metrics(staging: Path, resume_step: int, header: dict):
    """The private ``metrics.jsonl`` for appending: new with ``header``, or, when resuming, cut back to the
    checkpoint's step."""
    path = metrics_path(staging)
    if resume_step == 0 or not path.is_file():
        kept = [json.dumps(header)]
    else:  # only whole lines (ending in a newline) count: a line cut by a kill or a full disk is dropped
        kept = [ln for ln in atomic.complete_lines(path.read_text()) if _metrics_step(ln) <= resume_step]
        kept.append(json.dumps({"resumed_at_step": resume_step, "time": utc_now()}))
    atomic.write_text(path, "".join(ln + "\n" for ln in kept))  # whole or not at all
    return path.open("a")


def _metrics_step(line: str) -> float:
    """The step of one metrics line (0 for the header); a line cut by a kill is dropped (inf)."""
    try:
        return json.loads(line).get("step", 0)
    except (json.JSONDecodeError, AttributeError):
        return float("inf")


def record_failure(spec, state, err: BaseException, ledger, last_checkpoint=None) -> None:
    """FAILED.json with the steps done and ε charged (never a release); settle the ledger charge as failed.

    With a resume checkpoint the charge stays pending at its reservation (≥ what was spent) until the run is
    resumed or ``dplora ledger settle`` closes it.
    """
    plan, accounted = spec.plan, state.accountant.steps
    # Steps done are the logical steps that completed (state.step is set only after a step returns); a failure
    # inside a step's optimizer update (after its noise was drawn and the accountant stepped) leaves that step
    # undone, so FAILED.json agrees with the failure line ("failed at step k"). The charge stays an upper bound:
    # the accountant's count, which includes that step's noisy sum.
    done = min(state.step, accounted)
    spent = plan.epsilon_spent(accounted)  # 0.0 at 0 steps; finite (the plan's checked curve)
    entry = failure_entry(spec.run_id, done, plan.steps, spent, err)
    entry |= failure_fields(spec, state, err, last_checkpoint)
    try:
        write_json(spec.staging / "FAILED.json", entry)  # whole or not at all (dplora.atomic)
    except (OSError, atomic.DiskFullError):  # a full disk must not hide the original error
        pass
    (spec.staging / release.RELEASE_FILENAME).unlink(missing_ok=True)
    if ledger is not None and last_checkpoint is None:
        ledger.settle(spec.run_id, epsilon_spent=spent, status="failed")


def memory_kind(device) -> str:
    return "torch.cuda.max_memory_allocated" if device.type == "cuda" else "process peak RSS"


def reset_peak_memory(device) -> None:
    """Start the peak of :func:`peak_memory_gib` anew on CUDA (``torch.cuda.reset_peak_memory_stats``), right before
    step 1, so the reported peak is the training's and not the set-up's (the ``physical_batch_size: auto`` probe's
    64-record try, the time estimate's synthetic step, the model build). On CPU nothing: the peak RSS of a process
    cannot be reset (``getrusage``), so it still counts the set-up.

    Args:
        device: the run's ``torch.device``.
    Raises:
        Nothing of its own (a CUDA error of torch passes through).
    """
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device) -> float:
    """Peak memory of this process in GiB: ``torch.cuda.max_memory_allocated`` on CUDA (since
    :func:`reset_peak_memory`, before step 1), peak RSS on CPU (the process's, set-up included)."""
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def failure_entry(run_id: str | None, done: int, planned: int, spent: float, err: BaseException) -> dict:
    """The content of FAILED.json: steps done, ε charged, the one-line reason (never training text)."""
    return {
        "run_id": run_id,
        "steps_done": done,
        "steps_planned": planned,
        "epsilon_charged_upper_bound": spent if math.isfinite(spent) else "infinite (non-private control)",
        "reason": _failure_reason(err),
        # the stop rule read DP outputs of the steps taken: those steps stay charged, past any checkpoint
        "stopped_on_dp_output": isinstance(err, NoisyUpdateError),
        "time": utc_now(),
        "release": "none (run failed)",
    }


def _failure_reason(err: BaseException) -> str:
    """One line for FAILED.json: a DploraError's message, "SIGTERM" (the CLI's handler names it), or the class."""
    if isinstance(err, DploraError):
        return str(err)
    if isinstance(err, KeyboardInterrupt) and err.args:
        return str(err.args[0])
    return err.__class__.__name__


def write_outputs(spec, state, *, started: str, epsilon_spent: float, io: RunIO, ranks=None, evaluation=None) -> None:
    """Save the adapters and the resolved contract, then finish and sign the release (inside ``staging``).

    A control run signs its own non-private record (:mod:`dplora.mechanism.control`), never the DP one. A held-out
    evaluation enters the record only when its set is declared public.
    """
    from dplora.engine.basefiles import base_model_entry

    contract, plan = spec.contract, spec.plan
    staging = spec.staging.resolve()
    from dplora.engine.perexample import unwrap

    adapters = unwrap(state.model)
    size = sum(p.numel() * p.element_size() for p in adapters.parameters() if p.requires_grad)
    atomic.save_folder(staging / "adapter", adapters.save_pretrained, estimate=size + 64 * 1024)  # + config, card
    atomic.write_text(staging / "contract.yaml", contract.to_yaml())
    common = {
        "contract": contract,
        "plan": plan,
        "run_id": spec.run_id,
        "steps_done": state.step,
        "started_at": started,  # before the data was read (dplora.recipe.train): the record's only time
        "data_digest": release.data_digest_entry([Path(contract.data.path)], io.data_key),
        "base_model": base_model_entry(contract.model, io.log, dtype=spec.dtype),
        "execution": execution_entry(spec, reducer=getattr(state.optimizer, "reducer", None), ranks=ranks),
        "lora_targets": adapted_module_names(unwrap(state.model)),  # what auto / all-linear resolved to
    }
    if control.is_control(contract.privacy):  # its own predicate type (release.predicate_type_of), no ε
        record = non_private_record(**common)
    else:
        record = build_record(**common, epsilon_spent=epsilon_spent)
    if spec.tokenizer is not None:
        record["tokenization"] = tokenization_entry(spec.tokenizer, contract.data)
    if spec.warm_start is not None:  # data.public_warm_start only: the default record is unchanged
        record["public_warm_start"] = warm_start_entry(spec.warm_start)  # by name and sha256, no machine path
    if evaluation is not None and evaluation.public:
        record["evaluation"] = evaluation.to_dict()
    release.finish_release(staging, contract.data, record, private_key=io.private_key)
