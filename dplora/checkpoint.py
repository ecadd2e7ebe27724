"""Resume checkpoints: one file in ``<output_dir>.partial/``, written atomically, that a killed run resumes from.

``resume.safetensors`` holds the LoRA tensors (peft's adapter keys, fp32), the optimizer state tensors, and in
its header (JSON) the accountant history, the step count, the run id, the plan, the resolved contract, a digest
of the data file, the adapter config and the execution entry. It never holds the noise generator's or the
Poisson sampler's state: with them anyone could regenerate the noise and the batches; a resumed run reseeds
both from OS entropy (a fresh engine and sampler). A checkpoint is not a release: it is never signed as one,
and it is deleted before a finished run's folder is published.

Accounting errs towards counting (Opacus users lost accountant state on restart and counted ε from zero):
the accountant history and the tensors it accounts for are one atomic file, and the accountant is stepped
before the update is applied, so a checkpoint never holds an update its history does not count. A crash
loses the steps since the last checkpoint; a resume redoes them with fresh noise and a fresh sample and
never applies a saved step twice. Writes go to a temporary file in the same folder, are fsynced, then
renamed over the previous checkpoint (POSIX ``rename`` is atomic), so a crash mid-write leaves the last one.

The data digest is a plain sha256 of the data file: it stays in the private ``.partial`` folder (which also
holds unreleased adapters) and never enters a release record.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import yaml

from dplora.errors import BadInputError, TrainingFailedError

CHECKPOINT_FILENAME = "resume.safetensors"  # dplora.outputs accepts it in a .partial folder
FORMAT = "dplora-resume-checkpoint/1"
DEFAULT_INTERVAL_S = 600.0  # without training.checkpoint_every: about every 10 minutes of work
# Settings that may change on --resume: they change neither the DP mechanism nor the accounting.
RESUMABLE_CHANGES = ("training.threads", "training.physical_batch_size", "training.checkpoint_every")
# Tests only: "<point>:<step>" makes the process SIGKILL itself there (points: after-step, checkpoint-write).
FAULT_ENV = "DPLORA_TEST_FAULT"
NOT_STORED = "noise generator and Poisson sampler state (never stored; reseeded from OS entropy on resume)"


class CheckpointUnreadableError(BadInputError):
    """A checkpoint file exists but cannot be read (truncated, foreign, other format)."""


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint's header, read without torch.

    Attributes:
        path: the checkpoint file.
        meta: the JSON header (see :func:`write`).
    """

    path: Path
    meta: dict

    @property
    def run_id(self) -> str:
        return self.meta["run_id"]

    @property
    def step(self) -> int:
        """Logical steps applied to the saved tensors (= steps in the accountant history)."""
        return int(self.meta["step"])

    @property
    def steps_planned(self) -> int:
        return int(self.meta["plan"]["steps"])

    @property
    def accounted_steps(self) -> int:
        """Steps in the saved accountant history [(σ, q, steps)]."""
        return sum(int(n) for _, _, n in self.meta["accountant_history"])


def checkpoint_file(staging: Path) -> Path:
    """``<output_dir>.partial/resume.safetensors``."""
    return Path(staging) / CHECKPOINT_FILENAME


def fault_point(point: str, step: int) -> None:
    """Test hook: SIGKILL this process at ``point`` of ``step`` when ``$DPLORA_TEST_FAULT`` names it."""
    if os.environ.get(FAULT_ENV) == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def read_info(where: Path) -> CheckpointInfo | None:
    """The checkpoint header in ``where`` (a ``.partial`` folder or the file), or None if there is none.

    Raises:
        CheckpointUnreadableError: a file is there but is not a readable dplora checkpoint.
    """
    path = Path(where)
    path = checkpoint_file(path) if path.is_dir() else path
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            if not 2 <= size <= 64 << 20:
                raise ValueError("bad header size")
            header = json.loads(fh.read(size))
        meta = json.loads(header["__metadata__"]["dplora"])
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}")
        info = CheckpointInfo(path=path, meta=meta)
        if info.accounted_steps != info.step:
            raise ValueError("accountant history and step count disagree")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointUnreadableError(f"checkpoint {path} cannot be read ({err.__class__.__name__})") from None
    return info


def data_sha256(contract) -> str:
    """sha256 of the data file (kept in the private checkpoint only; see the module docstring)."""
    from dplora.release import sha256_file

    return sha256_file(Path(contract.data.path))


def _adapter_config(spec, state) -> dict:
    """The adapter_config.json a release of these tensors needs (base model named, never a local path)."""
    from dplora.engine import unwrap

    config = unwrap(state.model).peft_config["default"].to_dict()
    config["base_model_name_or_path"] = spec.contract.model.name or Path(spec.contract.model.path).name
    return json.loads(json.dumps(config, default=lambda o: sorted(o) if isinstance(o, set) else str(o)))


def write(spec, state, *, started_at: str, data_digest: str) -> CheckpointInfo:
    """Write the run's resume checkpoint atomically (temporary file, fsync, rename) into ``spec.staging``.

    Tensors: ``adapter.<peft key>`` (LoRA, fp32) and ``optimizer.<param index>.<key>``. Header: the rest.

    Raises:
        TrainingFailedError: the accountant history does not count exactly the steps taken (never saved).
        OSError: the write failed (the previous checkpoint is left as it was); ``filename`` names the file.
    """
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import save

    from dplora.engine import unwrap
    from dplora.run import _finite_flag
    from dplora.train import _now, execution_entry

    if state.accountant.steps != state.step:
        raise TrainingFailedError(f"accountant counted {state.accountant.steps} steps, run took {state.step}")
    if float(_finite_flag(state.named)) != 1.0:  # never checkpoint a NaN: resuming from it could not recover
        raise TrainingFailedError(f"non-finite parameter after step {state.step}")
    tensors = {
        f"adapter.{k}": v.detach().to("cpu", copy=True).contiguous()
        for k, v in get_peft_model_state_dict(unwrap(state.model)).items()
    }
    scalars: dict[str, dict] = {}
    for idx, entry in state.optimizer.original_optimizer.state_dict()["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{idx}.{key}"] = value.detach().to("cpu", copy=True).contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    plan = spec.plan
    meta = {
        "format": FORMAT,
        "run_id": spec.run_id,
        "step": state.step,
        "empty_steps": state.empty_steps,
        "accountant_history": [list(h) for h in state.accountant.history],
        "epsilon_upper": plan.epsilon_at(state.step),
        "plan": plan.to_dict(),
        "contract_yaml": spec.contract.to_yaml(),
        "contract_sha256": spec.contract.sha256,
        "data": {
            "file": Path(spec.contract.data.path).name,
            "sha256": data_digest,
            "num_records": spec.unit_index.num_records,
            "num_units": spec.unit_index.num_units,
        },
        "optimizer": {"class": type(state.optimizer.original_optimizer).__name__, "scalars": scalars},
        "adapter_config": _adapter_config(spec, state),
        "execution": execution_entry(spec),
        "started_at": started_at,
        "written_at": _now(),
        "not_stored": NOT_STORED,
    }
    payload = save(tensors, metadata={"dplora": json.dumps(meta, sort_keys=True)})
    path = checkpoint_file(spec.staging)
    _atomic_write(path, payload, state.step)
    return CheckpointInfo(path=path, meta=meta)


def _atomic_write(path: Path, payload: bytes, step: int) -> None:
    """Temporary file in the same folder, fsync, ``os.replace``, fsync the folder; nothing left on failure."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".resume.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            half = len(payload) // 2
            fh.write(payload[:half])
            fh.flush()
            fault_point("checkpoint-write", step)
            fh.write(payload[half:])
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename is None:
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise


def remove_stale(staging: Path) -> None:
    """Delete temporary files a killed checkpoint write left behind (never the checkpoint itself)."""
    for tmp in Path(staging).glob(".resume.*.tmp"):
        tmp.unlink(missing_ok=True)


def discard(staging: Path) -> None:
    """Before publishing a finished run: the checkpoint and an earlier attempt's FAILED.json never leave."""
    checkpoint_file(staging).unlink(missing_ok=True)
    (Path(staging) / "FAILED.json").unlink(missing_ok=True)
    remove_stale(staging)


def restore(spec, state, info: CheckpointInfo) -> None:
    """Load the checkpoint's LoRA tensors, optimizer state, accountant history and step counts into ``state``.

    The noise generator and the sampler are not restored: the engine built for this process drew a fresh
    OS-entropy seed, and :func:`dplora.run.run_steps` makes a fresh sampler.

    Raises:
        CheckpointUnreadableError: the tensors do not match the model (every LoRA tensor must load exactly).
    """
    import torch
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    tensors = load_file(info.path, device="cpu")
    adapter = {k.removeprefix("adapter."): v for k, v in tensors.items() if k.startswith("adapter.")}
    from dplora.engine import unwrap

    peft_model = unwrap(state.model)
    set_peft_model_state_dict(peft_model, adapter)
    loaded = get_peft_model_state_dict(peft_model)
    if loaded.keys() != adapter.keys() or not all(torch.equal(loaded[k].cpu(), adapter[k]) for k in adapter):
        raise CheckpointUnreadableError(f"checkpoint {info.path}: its LoRA tensors do not match the model")
    optimizer = state.optimizer.original_optimizer
    saved: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            _, idx, name = key.split(".", 2)
            saved.setdefault(int(idx), {})[name] = value
    for idx, values in info.meta["optimizer"]["scalars"].items():
        saved.setdefault(int(idx), {}).update(values)
    optimizer.load_state_dict({"state": saved, "param_groups": optimizer.state_dict()["param_groups"]})
    state.accountant.history = [(float(s), float(q), int(n)) for s, q, n in info.meta["accountant_history"]]
    state.step = info.step
    state.empty_steps = int(info.meta["empty_steps"])


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            out |= _flat(value, f"{prefix}{key}.")
        return out
    return {prefix[:-1]: node}


def check_resumable(info: CheckpointInfo, contract, plan, unit_index, digest: str) -> None:
    """Refuse to resume a checkpoint under another contract, other data or another plan, naming what changed.

    Raises:
        BadInputError: one line naming the changed keys, the data file, or the plan values.
    """
    before = _flat(yaml.safe_load(info.meta["contract_yaml"]))
    now = _flat(yaml.safe_load(contract.to_yaml()))
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
            f"--resume: the data changed since the checkpoint: {contract.data.path} differs from the file the run "
            f"started on ({data['num_records']} records then, {unit_index.num_records} now); resume needs the same data"
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
        raise BadInputError(f"--resume: checkpoint {info.path} holds {info.step} steps, above the planned T")


def resume_point(staging: Path, contract, plan, unit_index) -> tuple[CheckpointInfo, str]:
    """For ``--resume``: the checkpoint to continue from and the data digest, after every check.

    Raises:
        BadInputError: no checkpoint, an unreadable one, or a changed contract, data or plan (exit 2).
    """
    try:
        info = read_info(staging)
    except CheckpointUnreadableError as err:
        raise BadInputError(f"--resume: {err}; it cannot be resumed") from None
    if info is None:
        raise BadInputError(f"--resume: no resume checkpoint in {staging}; run without --resume to start a new run")
    digest = data_sha256(contract)
    check_resumable(info, contract, plan, unit_index, digest)
    return info, digest


def prepare_staging(out: Path, *, resuming: bool, overwrite: bool, ledger, log) -> Path:
    """Make ``<output_dir>.partial`` ready and return it: kept when resuming, else a fresh one, never silently.

    A folder holding a resume checkpoint or a FAILED.json is replaced only with ``--overwrite``; its run's
    pending ledger charge (if in ``ledger``) is then settled as failed at the ε of the checkpoint's steps.

    Raises:
        BadInputError: such a folder without ``--overwrite`` (exit 2; nothing is touched), or see
            :func:`dplora.outputs.fresh_staging`.
    """
    from dplora import outputs

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
        if (info is not None or unreadable or failed) and not overwrite:
            what = (
                f"a resume checkpoint of run {info.run_id} at step {info.step}/{info.steps_planned}: finish it with "
                "--resume, or pass --overwrite to discard it"
                if info is not None
                else "an earlier run's FAILED.json and checkpoint files: read them, then pass --overwrite to replace "
                "them"
            )
            raise BadInputError(f"{staging} holds {what}")
        if info is not None:
            _settle_discarded(info, ledger, log)
    return outputs.fresh_staging(out)


def _settle_discarded(info: CheckpointInfo, ledger, log) -> None:
    """--overwrite discards a resumable run: close its pending charge at the ε of its checkpoint's steps."""
    if ledger is None:
        return
    try:
        charge = ledger.charge(info.run_id)
    except BadInputError:
        return
    if charge.status == "pending":
        ledger.settle(info.run_id, epsilon_spent=str(info.meta["epsilon_upper"]), status="failed")
        log(
            f"note: run {info.run_id} discarded at step {info.step}: its ledger charge is settled at "
            f"ε={info.meta['epsilon_upper']:.4f}"
        )


class Checkpointer:
    """Writes resume checkpoints during :func:`dplora.run.run_steps` and turns SIGTERM/SIGINT into a clean stop.

    A checkpoint is written before step 1 (or not, when resuming from one), every ``training.checkpoint_every``
    logical steps (default: when ``DEFAULT_INTERVAL_S`` seconds passed since the last one), after the last
    step, and at the first step boundary after SIGTERM or SIGINT; then ``KeyboardInterrupt(signal name)`` is
    raised. A second signal stops at once (no checkpoint of a half-applied step is ever written).
    """

    def __init__(self, spec, state, *, started_at: str, data_digest: str, log, last: CheckpointInfo | None = None):
        self.spec, self.state, self.log = spec, state, log
        self.started_at, self.data_digest = started_at, data_digest
        self.every = spec.contract.training.checkpoint_every
        self.last = last
        self._t_last = time.monotonic()
        self._signal: str | None = None
        self._previous: dict = {}

    def __enter__(self) -> Checkpointer:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _on_signal(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        if self._signal is not None:
            raise KeyboardInterrupt(name)
        self._signal = name
        self.log(f"{name}: stopping after the current step with a resume checkpoint (send it again to stop at once)")

    def write(self) -> None:
        """Write a checkpoint of the current step (skipped if the last one already holds it)."""
        if self.last is not None and self.last.step == self.state.step:
            return
        self.last = write(self.spec, self.state, started_at=self.started_at, data_digest=self.data_digest)
        self._t_last = time.monotonic()

    def after_step(self, spec, state) -> None:
        """Called by ``run_steps`` after each logical step: checkpoint when due; stop cleanly after a signal."""
        fault_point("after-step", state.step)
        due = state.step == spec.plan.steps or self._signal is not None
        if self.every is not None:
            due = due or state.step % self.every == 0
        else:
            due = due or time.monotonic() - self._t_last >= DEFAULT_INTERVAL_S
        if due:
            self.write()
        if self._signal is not None:
            raise KeyboardInterrupt(self._signal)


def _what_happened(err: BaseException, step: int) -> tuple[str, str]:
    """(what happened, extra resume advice) in one line, never with training text."""
    import torch

    cuda_oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    if isinstance(err, cuda_oom | MemoryError):
        kind = "accelerator" if isinstance(err, cuda_oom) else "host"
        return f"out of {kind} memory at step {step + 1}", " with a smaller training.physical_batch_size"
    if isinstance(err, OSError):
        where = f" ({err.filename})" if err.filename else ""
        if err.errno == errno.ENOSPC:
            return f"disk full{where} at step {step}", " once there is free space"
        return f"{err.strerror or err.__class__.__name__}{where} at step {step}", ""
    if isinstance(err, TrainingFailedError):
        return str(err), ""
    return f"training failed at step {step}: {err.__class__.__name__}", ""


def failure_line(err: BaseException, spec, state, last: CheckpointInfo | None) -> str:
    """The one-line exit-4 message: what happened, where the last checkpoint is, and how to resume."""
    what, advice = _what_happened(err, state.step)
    return f"{what}; no release was written; {resume_hint(spec, last, advice)}"


def resume_hint(spec, last: CheckpointInfo | None, advice: str = "") -> str:
    """How to go on from here, in words (the ledger charge of a resumable run stays pending)."""
    if last is None:
        return f"no resume checkpoint was written: see {spec.staging / 'FAILED.json'}"
    charge = f"; its ledger charge stays pending until then (or `dplora ledger settle {spec.run_id}`)"
    return (
        f"the resume checkpoint holds step {last.step}/{spec.plan.steps} in {spec.staging}: rerun the same command "
        f"with --resume{advice}" + (charge if spec.contract.privacy.population else "")
    )


def failure_fields(spec, state, err: BaseException, last: CheckpointInfo | None) -> dict:
    """Extra FAILED.json fields: what happened in one line, the resume checkpoint's step and ε, how to resume."""
    if isinstance(err, KeyboardInterrupt):
        what = f"interrupted by {err.args[0] if err.args else 'Ctrl-C'} after step {state.step}"
    else:
        what = _what_happened(err, state.step)[0]
    if last is None:
        return {"what_happened": what, "resume_checkpoint": None}
    return {
        "what_happened": what,
        "resume_checkpoint": {
            "file": last.path.name,
            "step": last.step,
            "epsilon_upper": last.meta["epsilon_upper"],
        },
        "resume": "rerun the same `dplora train` command with --resume",
    }
