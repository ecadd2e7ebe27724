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

import contextlib
import dataclasses
import json
import os
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from dplora import atomic
from dplora.data.digest import sha256_file
from dplora.errors import BadInputError, NoisyUpdateError, TrainingFailedError
from dplora.signals import GracefulStop

CHECKPOINT_FILENAME = "resume.safetensors"  # dplora.run.outputs accepts it in a .partial folder
FORMAT = "dplora-resume-checkpoint/1"
# Tests only: "<point>:<step>" makes the process SIGKILL itself there (points: :func:`fault_point`).
FAULT_ENV = "DPLORA_TEST_FAULT"
_FAULT_HOOKS: list[Callable[[str, int], None]] = []  # :func:`fault_hook`'s, in the order registered
NOT_STORED = (
    "noise key and Poisson sampler state (never stored; a fresh ChaCha20 key and sampler from OS entropy on resume)"
)


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
    """Test seam: call the :func:`fault_hook` hooks, then SIGKILL this process at ``point`` of ``step`` when
    ``$DPLORA_TEST_FAULT`` names it (``"<point>:<step>"``). Nothing happens otherwise.

    Points (``step`` is the logical steps done there, ``state.step``):
        ``loop-start``, ``loop-end``: rank 0's training phase, right before and right after
            :func:`dplora.run.loop.run_steps` (inside the timed loop; the accounting check and the held-out
            evaluation come after ``loop-end``);
        ``after-step``: after each logical step is applied and logged, before its checkpoint
            (:meth:`Checkpointer.after_step`);
        ``checkpoint-write``: half-way through writing a resume checkpoint's file.
    """
    for hook in tuple(_FAULT_HOOKS):
        hook(point, step)
    if os.environ.get(FAULT_ENV) == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def fault_hook(hook: Callable[[str, int], None]) -> Iterator[None]:
    """Test seam: ``hook(point, step)`` is called at every :func:`fault_point` of this process while the block runs.

    A hook injects a fault where it is called (raise, or send this process a signal) or observes the run's phases;
    it is removed when the block ends, also on an error. Hooks nest and run in the order registered. Without one
    (every production run) :func:`fault_point` only reads ``$DPLORA_TEST_FAULT``.
    """
    _FAULT_HOOKS.append(hook)
    try:
        yield
    finally:
        _FAULT_HOOKS.remove(hook)


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


def data_sha256(data) -> str:
    """sha256 of the data section's file (:class:`dplora.contract.spec.DataSection`; kept in the private checkpoint
    only; see the module docstring)."""
    return sha256_file(Path(data.path))


def _adapter_config(spec, state) -> dict:
    """The adapter_config.json a release of these tensors needs (base model named, never a local path)."""
    from dplora.engine.perexample import unwrap

    config = unwrap(state.model).peft_config["default"].to_dict()
    config["base_model_name_or_path"] = spec.config.base_model_name
    return json.loads(json.dumps(config, default=lambda o: sorted(o) if isinstance(o, set) else str(o)))


def check_tokenization(info: CheckpointInfo, now: dict) -> None:
    """Refuse to resume a checkpoint whose records were rendered by another chat template (or none).

    Args:
        now: :func:`dplora.data.chat.tokenization_entry` of this run.

    Raises:
        BadInputError: one line naming the template before and now.
    """
    before = info.meta.get("tokenization") or {"chat_template": "none (raw text)", "chat_template_sha256": None}
    if before.get("chat_template_sha256") != now["chat_template_sha256"]:

        def name(t: dict) -> str:
            sha = t.get("chat_template_sha256")
            return f"{t.get('chat_template')} template {sha[:12]}" if sha else "raw text (no template)"

        raise BadInputError(
            f"--resume: the checkpoint's records were tokenized as {name(before)}, this run's as {name(now)} "
            "(data.chat_template or the model's template changed); resume needs the same tokenization"
        )


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

    from dplora.engine.perexample import unwrap
    from dplora.run.execution import execution_entry, utc_now
    from dplora.run.loop import finite_flag

    if state.accountant.steps != state.step:
        raise TrainingFailedError(f"accountant counted {state.accountant.steps} steps, run took {state.step}")
    if float(finite_flag(state.named)) != 1.0:  # never checkpoint a NaN: resuming from it could not recover
        raise NoisyUpdateError(f"non-finite parameter after step {state.step}")
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
        "contract_yaml": spec.config.contract_yaml,
        "contract_sha256": spec.config.contract_sha256,
        "data": {
            "file": spec.config.data_file_name,
            "sha256": data_digest,
            "num_records": spec.unit_index.num_records,
            "num_units": spec.unit_index.num_units,
        },
        "tokenization": spec.tokenization,
        # data.public_warm_start: the record's entry (a resume does not redo the warm start); absent without one
        **({"warm_start": spec.warm_start} if spec.warm_start is not None else {}),
        "optimizer": {"class": type(state.optimizer.original_optimizer).__name__, "scalars": scalars},
        "adapter_config": _adapter_config(spec, state),
        "execution": execution_entry(spec),
        "started_at": started_at,
        "written_at": utc_now(),
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
        atomic.fsync_dir(path.parent)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in atomic.DISK_FULL_ERRNOS:
            raise atomic.disk_full_error(path, err) from err
        if isinstance(err, OSError) and err.filename is None:
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise


def remove_stale(staging: Path) -> None:
    """Delete temporary files a killed checkpoint write left behind (never the checkpoint itself)."""
    for tmp in Path(staging).glob(".resume.*.tmp"):
        tmp.unlink(missing_ok=True)


def discard(staging: Path) -> None:
    """Before publishing a finished run: the checkpoint and an earlier attempt's FAILED.json (public and private)
    never leave."""
    checkpoint_file(staging).unlink(missing_ok=True)
    (Path(staging) / "FAILED.json").unlink(missing_ok=True)
    (Path(staging) / "private" / "FAILED.json").unlink(missing_ok=True)
    remove_stale(staging)


def restore(spec, state, info: CheckpointInfo) -> None:
    """Load the checkpoint's LoRA tensors, optimizer state, accountant history and step counts into ``state``.

    The noise generator and the sampler are not restored: the engine built for this process drew a fresh
    256-bit ChaCha20 key from ``os.urandom``, and :func:`dplora.run.loop.run_steps` makes a fresh sampler.

    Raises:
        CheckpointUnreadableError: the tensors do not match the model (every LoRA tensor must load exactly).
        BadInputError: the checkpoint was tokenized under another chat template (or none).
    """
    import torch
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    if spec.tokenizer is not None:
        check_tokenization(info, spec.tokenization)
    tensors = load_file(info.path, device="cpu")
    adapter = {k.removeprefix("adapter."): v for k, v in tensors.items() if k.startswith("adapter.")}
    from dplora.engine.perexample import unwrap

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


def stop_line(name: str) -> str:
    """The public line on the first SIGTERM/SIGINT (``name``): the same wherever the run was when it came."""
    return f"{name}: stopping after the current step with a resume checkpoint (send it again to stop at once)"


def default_checkpoint_every(steps: int) -> int:
    """Logical steps between resume checkpoints without ``training.checkpoint_every``: ⌈T/10⌉ (≥ 1), a function of
    the plan's T only, like the public progress lines' cadence."""
    return max(1, -(-int(steps) // 10))


class Checkpointer(GracefulStop):
    """Writes resume checkpoints during :func:`dplora.run.loop.run_steps` and turns SIGTERM/SIGINT into a clean stop.

    A checkpoint is written before step 1 (or not, when resuming from one), every ``training.checkpoint_every``
    logical steps (default :func:`default_checkpoint_every`: ⌈T/10⌉, fixed by the plan, never by elapsed time,
    which follows the realised private batches), after the last step, and at the first step boundary after SIGTERM
    or SIGINT; then ``KeyboardInterrupt(signal name)`` is raised. A second signal stops at once (no checkpoint of a
    half-applied step is ever written).
    """

    def __init__(self, spec, state, *, started_at: str, data_digest: str, log, last: CheckpointInfo | None = None):
        self.spec, self.state, self.log = spec, state, log
        self.started_at, self.data_digest = started_at, data_digest
        self.every = spec.config.flags.checkpoint_every or default_checkpoint_every(spec.plan.steps)
        self.last = last
        super().__init__()

    def on_first(self, name: str) -> None:
        self.log(stop_line(name))

    @property
    def stopping(self) -> bool:
        """A signal asked the run to stop at the next step boundary."""
        return self.signal_name is not None

    def request_stop(self, name: str) -> None:
        """Stop at the next step boundary with a checkpoint, as after a signal (another rank got one)."""
        if self.signal_name is None:
            self.signal_name = name

    def write(self) -> None:
        """Write a checkpoint of the current step (skipped if the last one already holds it)."""
        if self.last is not None and self.last.step == self.state.step:
            return
        self.last = write(self.spec, self.state, started_at=self.started_at, data_digest=self.data_digest)

    def after_step(self, spec, state) -> None:
        """Called by ``run_steps`` after each logical step: checkpoint when due; stop cleanly after a signal."""
        fault_point("after-step", state.step)
        due = state.step == spec.plan.steps or self.signal_name is not None or state.step % self.every == 0
        if due:
            self.write()
        if self.signal_name is not None:
            raise KeyboardInterrupt(self.signal_name)


def after_step_hook(state, checkpointer: Checkpointer):
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
