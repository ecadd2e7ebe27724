"""What the ledger does with a run's resume checkpoint: settle a killed run, sign an intermediate release.

``dplora ledger settle RUN_ID`` closes a run that will not be resumed. A run with a resumable checkpoint is
refused unless ``--abandon`` is given; the charge is then its reserved ε (the plan's T steps), never the ε of the
step it reached: a signal, a kill or a failure stopped it at a step that wall-clock time and its private batches
decided, and a charge that followed that step would publish it. Only a stop by the DP stop rule (a DP output) is
charged the steps it took. ``dplora ledger record-release RUN`` signs the adapters of such a DP-stopped run's latest
checkpoint as an intermediate release at the ε of its steps: post-processing of an already charged run, not a new
charge (Dwork & Roth 2014, Prop. 2.1); adapters at a step chosen by a signal are never released. Neither command
loads a model into memory; ``settle`` never imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid
from decimal import Decimal
from pathlib import Path

import yaml

from dplora import atomic
from dplora.contract.choices import ProtectedUnit
from dplora.data import digest as digests
from dplora.errors import BadInputError
from dplora.ledger.store import Charge, Ledger
from dplora.run.checkpoint import CheckpointInfo, CheckpointUnreadableError, read_info
from dplora.run.resume import steps_run


def plan_from_checkpoint(info: CheckpointInfo):
    """The run's :class:`dplora.plan.training.TrainingPlan`, rebuilt from the checkpoint header (no data, no model).

    Raises:
        CheckpointUnreadableError: the header was written by a dplora whose plan had other fields.
    """
    from dplora.accounting.events import Accountant, Adjacency
    from dplora.plan.training import TrainingPlan

    saved = info.meta["plan"]
    enums = {"protected_unit": ProtectedUnit, "adjacency": Adjacency, "accountant": Accountant}
    try:
        values = {f.name: saved[f.name] for f in dataclasses.fields(TrainingPlan) if f.name in saved}
        values |= {k: enums[k](values[k]) for k in enums}
        values["epsilon_curve"] = tuple((int(s), float(e)) for s, e in values["epsilon_curve"])
        values["warnings"] = tuple(values.get("warnings", ()))
        return TrainingPlan(**values)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointUnreadableError(f"checkpoint {info.path}: its plan cannot be read ({err})") from None


def epsilon_of(info: CheckpointInfo) -> float:
    """ε after the steps in the checkpoint's accountant history, from the run's own plan (an upper bound)."""
    return plan_from_checkpoint(info).epsilon_at(info.accounted_steps)


def locate(ledger: Ledger, run: str, checkpoint: Path | None = None) -> tuple[str, CheckpointInfo | None, str]:
    """Find a run's checkpoint: (run id, checkpoint or None, why none was read).

    Args:
        ledger: the ledger holding the run's charge.
        run: a run id, or a ``<output_dir>.partial`` folder / checkpoint file.
        checkpoint: where to look instead of the folder the ledger recorded.

    Raises:
        BadInputError: ``run`` is a folder without a checkpoint.
    """
    if checkpoint is None and Path(run).exists():
        info = read_info(Path(run))
        if info is None:
            raise BadInputError(f"no resume checkpoint in {run}")
        return info.run_id, info, ""
    where = checkpoint or ledger.checkpoint_path(run)
    if where is None:
        return run, None, "the ledger records no checkpoint folder for this run"
    try:
        info = read_info(Path(where))
    except CheckpointUnreadableError as err:
        return run, None, str(err)
    if info is None:
        return run, None, f"no checkpoint in {where}"
    if info.run_id != run:
        return run, None, f"{where} holds the checkpoint of another run ({info.run_id})"
    return run, info, ""


def _still_running(staging: Path) -> bool:
    """True while a ``dplora train`` holds ``<output_dir>.lock`` (flock) for this folder."""
    import fcntl

    lock = staging.with_name(staging.name.removesuffix(".partial") + ".lock")
    if not lock.is_file():
        return False
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def stopped_on_dp_output(staging: Path) -> bool:
    """The run in ``staging`` was stopped by the DP stop rule (its public FAILED.json says so): a non-finite
    parameter after a noisy update, a DP output. Any other stop (a signal, a kill, a failure that read no DP output)
    happened at a step that wall-clock time and the realised batches decided."""
    try:
        failed = json.loads((Path(staging) / "FAILED.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(failed, dict) and failed.get("stopped_on_dp_output") is True


def abandoned_epsilon(charge: Charge, info: CheckpointInfo, ran: int | None) -> tuple[Decimal, str]:
    """(ε, how it was found, in words) for closing the pending charge of a resumable run that will not be resumed.

    The reserved ε (the plan's T steps), whatever step the run reached: that step is a function of when it was
    stopped and of its realised batches, and a charge that followed it would publish it (``ledger show``). A run
    stopped by the DP stop rule read DP outputs of every step it took: the ε of those steps (``ran``), as today.
    """
    reserved = Decimal(str(charge.reserved_epsilon or charge.epsilon))
    if stopped_on_dp_output(info.path.parent) and ran is not None:
        plan = plan_from_checkpoint(info)
        return Decimal(str(plan.epsilon_at(max(ran, info.accounted_steps)))), "the DP stop rule's steps,"
    return reserved, "its reserved"


def settle(ledger: Ledger, run_id: str, *, abandon: bool, checkpoint: Path | None = None) -> tuple[Charge, str]:
    """Close a pending charge of a run that will not be resumed: (the settled charge, how ε was found).

    A run with a resumable checkpoint is closed only with ``abandon``, at its reserved ε (:func:`abandoned_epsilon`;
    never at the step it reached).

    Raises:
        BadInputError: no such charge, not pending, or a resumable checkpoint without ``abandon``.
    """
    charge = ledger.charge(run_id)
    if charge.status != "pending":
        raise BadInputError(f"run {run_id} is already {charge.status} at ε={charge.epsilon}: nothing to settle")
    _, info, why = locate(ledger, run_id, checkpoint)
    if info is not None and _still_running(info.path.parent):
        raise BadInputError(f"run {run_id} is still running (it holds the lock next to {info.path.parent})")
    if info is not None:
        eps, how = abandoned_epsilon(charge, info, steps_run(info.path.parent, info))
        if not abandon:
            raise BadInputError(
                f"run {run_id} has a resumable checkpoint in {info.path.parent}: finish it with "
                f"`dplora train CONFIG --resume`, or pass --abandon to close it at ε={float(eps):.4f}"
            )
        how = f"{how} ε"
    else:
        eps = Decimal(str(charge.reserved_epsilon or charge.epsilon))
        how = f"the planned ε (no checkpoint could be read: {why})"
    settled = ledger.settle(run_id, epsilon_spent=eps, status="failed")
    return settled, how


def record_release(
    ledger: Ledger,
    run: str,
    *,
    private_key,
    data_key: bytes | None = None,
    output: Path | None = None,
    checkpoint: Path | None = None,
    log=print,
) -> tuple[Path, float, int]:
    """Sign the adapters of a charged run's latest checkpoint as an intermediate release: (folder, ε, steps).

    The folder (default ``<output_dir>.step-<k>``) holds ``adapter/``, ``contract.yaml`` and a signed
    ``release.dsse.json`` whose record says ``steps_done=k`` and ``epsilon_spent`` = ε after k steps; the
    ledger records it as a release of the run (its charge never drops below that ε). The base model must be
    where the contract says (the record lists its files' digests, as a final release does).

    Raises:
        BadInputError: no charge or no readable checkpoint, no step taken yet, the folder exists, or the base
            model cannot be found.
    """
    from safetensors.numpy import load_file, save_file

    from dplora.contract.loader import parse_contract
    from dplora.engine.basefiles import base_model_entry
    from dplora.release import envelope as release
    from dplora.release import report

    run_id, info, why = locate(ledger, run, checkpoint)
    if info is None:
        raise BadInputError(f"run {run_id}: no checkpoint to release ({why})")
    ledger.charge(run_id)  # must be charged already
    if not parse_contract(yaml.safe_load(info.meta["contract_yaml"])).privacy.enabled:
        raise BadInputError(f"run {run_id} is a non-private control (privacy.enabled=false): it has no DP release")
    if not stopped_on_dp_output(info.path.parent):
        # adapters at the step a signal, a kill or a failure stopped the run (a function of wall-clock time and the
        # realised batches) are not a DP output at any ε: only the DP stop rule's stop may be released early
        raise BadInputError(
            f"run {run_id} was stopped by a signal or a failure, at a step that time and its private batches "
            f"decided: no intermediate release at any ε; resume it to its planned T (`dplora train CONFIG --resume`) "
            f"or abandon it (`dplora ledger settle {run_id} --abandon`)"
        )
    if info.step == 0:
        raise BadInputError(f"run {run_id}: its checkpoint holds no step yet; nothing to release")
    plan = plan_from_checkpoint(info)
    eps = plan.epsilon_at(info.accounted_steps)
    staging = info.path.parent
    dest = output or staging.with_name(f"{staging.name.removesuffix('.partial')}.step-{info.step}")
    if dest.exists():
        raise BadInputError(f"{dest} exists; choose another --output")
    contract = parse_contract(yaml.safe_load(info.meta["contract_yaml"]))
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        (tmp / "adapter").mkdir(parents=True)
        tensors = load_file(info.path)
        adapter = {k.removeprefix("adapter."): v for k, v in tensors.items() if k.startswith("adapter.")}
        save_file(adapter, tmp / "adapter" / "adapter_model.safetensors", metadata={"format": "pt"})
        config = json.dumps(info.meta["adapter_config"], indent=2, sort_keys=True) + "\n"
        atomic.write_text(tmp / "adapter" / "adapter_config.json", config)
        atomic.write_text(tmp / "contract.yaml", info.meta["contract_yaml"])
        facts = report.PublicFacts(
            contract=contract,
            plan=plan,
            run_id=run_id,
            steps_done=info.step,
            epsilon_spent=eps,
            private=True,
            started_at=info.meta["started_at"],
            data_digest=release.data_digest_entry([Path(contract.data.path)], data_key),
            base_model=base_model_entry(contract.model, log, dtype=info.meta["execution"].get("base_dtype")),
            execution=info.meta["execution"],
            lora_targets=_adapter_targets(info.meta["adapter_config"]),
            warm_start=info.meta.get("warm_start"),  # data.public_warm_start: as the final release states it
            intermediate={
                "steps_done": info.step,
                "steps_planned": plan.steps,
                "note": "adapters after steps_done of steps_planned logical steps, signed from the run's resume "
                "checkpoint; post-processing of the run, charged with it in the ledger (not a new charge)",
            },
        )
        report.sign(facts, tmp, private_key=private_key)
        sha = digests.sha256_file(tmp / release.RELEASE_FILENAME)
        ledger.record_release(
            run_id=run_id, record_sha256=sha, epsilon=str(eps), delta=str(plan.delta), label=f"step-{info.step}"
        )
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest, eps, info.step


def _adapter_targets(adapter_config: dict) -> list[str] | None:
    """The adapted modules' leaf names from peft's saved ``adapter_config`` (what ``auto``/``all-linear`` chose)."""
    targets = adapter_config.get("target_modules")
    if isinstance(targets, list | tuple) and all(isinstance(t, str) for t in targets):
        return sorted({t.rsplit(".", 1)[-1] for t in targets})
    return None
