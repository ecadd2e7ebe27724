"""Multi-process DP-LoRA (``torchrun`` / ``accelerate launch``): one logical DP-SGD step across W processes.

The mechanism is the single-process one (Abadi et al. 2016, Alg. 1; units as in Charles et al. 2024, arXiv
2407.07737); only where its parts run changes:

- **Sharding.** Unit u (0..N-1) belongs to rank u mod W: the shards are disjoint and cover every unit, and every
  record of a unit stays on that unit's rank, so per-unit clipping needs no cross-rank traffic.
- **Sampling.** Each rank Poisson-samples its own shard at rate q with its own OS-entropy generator
  (``numpy.random.default_rng()``, never seeded). Every unit is then included independently with probability q by
  exactly one rank, so the union over ranks is one Poisson sample at rate q over all N units, as in one process.
- **Clipping and reduction.** Each rank clips its units to C and sums; the sums are added by ONE all-reduce per
  logical step (:class:`StepReducer`), which also carries the step's unit, record and noise-draw counts.
- **Noise.** N(0, σ²C²) is drawn once per logical step, on rank 0 only (its own ChaCha20 key from ``os.urandom``,
  :mod:`dplora.mechanism.noise`), and added to
  rank 0's contribution before the reduction; the reduction counts the draws and the step fails unless exactly one
  was made.
- **Normaliser.** Every rank divides the reduced sum by the public expected units per step E = q·N, whatever W.
- **One run.** Every rank applies the same reduced gradient to the same initial adapters (broadcast from rank 0),
  so the adapters stay identical; :func:`check_agreement` compares their digests and step counts before rank 0
  alone writes the release, charges the ledger and holds the output lock.

All ranks are one trusted party (one operator's processes): a rank sees its peers' partial sums in the
reduction; what is protected is the release. Process setup uses ``accelerate``'s :class:`PartialState` (gloo on
CPU, nccl on CUDA, one GPU per local rank); the collectives are ``torch.distributed``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import hashlib
import os
from collections.abc import Mapping

import numpy as np

from dplora import errors
from dplora.errors import BadInputError, DploraError, TrainingFailedError

SHARDING = "unit u belongs to rank u mod W (disjoint shards; all records of a unit on its rank)"
SAMPLING = (
    "each rank Poisson-samples its shard at rate q from its own OS-entropy generator: "
    "the union is one Poisson sample at rate q over all units"
)
NOISE = (
    "N(0, σ²C²) drawn once per logical step on rank 0 (ChaCha20 keyed from os.urandom) and added before the all-reduce"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class World:
    """The processes of one run.

    Attributes:
        rank: this process, 0..world_size-1 (rank 0 writes, locks, charges and reports).
        world_size: W, processes in the run (1: the single-process path, no collective is ever called).
        local_rank: this process on its node (its GPU index).
        local_world_size: processes on this node (they share its CPU cores).
        launcher: how the processes were started, in words (recorded in the release).
        backend: the torch.distributed backend (``gloo`` | ``nccl``), None for one process.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    launcher: str = "single process"
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that reads the keys, holds the lock, charges the ledger and writes the release."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """More than one process."""
        return self.world_size > 1


SINGLE = World()


def launcher_name(env: Mapping[str, str] = os.environ) -> str:
    """How this process was started, from the launchers' environment variables (for the release record)."""
    if int(env.get("WORLD_SIZE", "1") or 1) <= 1:
        return "single process"
    if any(k.startswith("ACCELERATE_") for k in env):
        return "accelerate launch (torchrun)"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    return "environment (RANK, WORLD_SIZE, MASTER_ADDR)"


COLLECTIVE_TIMEOUT_S = 300.0
"""Default seconds a collective may wait for its peers before it fails (``$DPLORA_COLLECTIVE_TIMEOUT_S`` overrides).

torch's defaults are 10 minutes for nccl and 30 for gloo (``init_process_group``'s ``timeout``, torch.distributed
docs). A rank that dies inside a collective it cannot report through (an FSDP forward's all-gather) leaves its
peers waiting that long; 5 minutes bounds that wait and still exceeds every stretch where rank 0 works alone
between two collectives (planning, a resume checkpoint, reading the keys)."""

COLLECTIVE_TIMEOUT_ENV = "DPLORA_COLLECTIVE_TIMEOUT_S"


def collective_timeout(env: Mapping[str, str] = os.environ):
    """The process group's collective timeout: ``$DPLORA_COLLECTIVE_TIMEOUT_S`` seconds, else
    :data:`COLLECTIVE_TIMEOUT_S`.

    Raises:
        BadInputError: the variable is not a positive number of seconds.
    """
    import datetime

    raw = str(env.get(COLLECTIVE_TIMEOUT_ENV, "") or "").strip()
    try:
        seconds = float(raw) if raw else COLLECTIVE_TIMEOUT_S
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise BadInputError(f"{COLLECTIVE_TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return datetime.timedelta(seconds=seconds)


FSDP_UNAPPLIED = ("FSDP_OFFLOAD_PARAMS", "FSDP_CPU_RAM_EFFICIENT_LOADING")  # refused when true: not built


def accelerate_fsdp_note(sharding: str, env: Mapping[str, str] = os.environ) -> str | None:
    """An ``accelerate launch`` FSDP config (``ACCELERATE_USE_FSDP``) against the contract's ``training.sharding``.

    dplora shards the base by its own recipe (:mod:`dplora.engine.sharding`), so a launcher's FSDP plugin maps onto
    ``training.sharding: fsdp`` and is never applied silently: under ``none`` it is refused; under ``fsdp`` the
    launcher's ``FSDP_*`` settings that dplora does not apply are named in one line.

    Returns:
        The note (public: the launcher's settings and the contract only), or None without an FSDP config.
    Raises:
        BadInputError: an FSDP config with ``training.sharding: none``, or CPU offload (not built).
    """
    if str(env.get("ACCELERATE_USE_FSDP", "")).lower() not in ("true", "1", "yes"):
        return None
    if sharding != "fsdp":
        raise BadInputError(
            "accelerate launch was given an FSDP config (ACCELERATE_USE_FSDP=true) but the contract has "
            "training.sharding: none; set training.sharding: fsdp (dplora shards the base itself) or launch "
            "without the FSDP config"
        )
    offload = [k for k in FSDP_UNAPPLIED if str(env.get(k, "")).lower() in ("true", "1", "yes")]
    if "FSDP_OFFLOAD_PARAMS" in offload:
        raise BadInputError(
            "accelerate's FSDP config asks for CPU offload (FSDP_OFFLOAD_PARAMS), which dplora has not built"
        )
    named = sorted(k for k in env if k.startswith("FSDP_"))
    if not named:
        return None
    return (
        "note: accelerate's FSDP config maps onto training.sharding: fsdp (every decoder layer and the root "
        f"fully_shard-ed, LoRA whole on every rank); not applied: {', '.join(named)}"
    )


def init_world(env: Mapping[str, str] = os.environ) -> World:
    """The run's processes: :data:`SINGLE` unless a launcher set ``WORLD_SIZE`` > 1, else join the process group.

    ``accelerate``'s :class:`PartialState` initialises ``torch.distributed`` from the launcher's environment
    (gloo on CPU; nccl with this process's GPU selected on CUDA), with the collective timeout of
    :func:`collective_timeout`. On CUDA, ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` is set to 1 unless the operator set it:
    ProcessGroupNCCL reads it when the group is created, and with 1 its watchdog aborts the communicators and ends
    the process once a collective fails or passes the timeout (torch docs, "PYTORCH ProcessGroupNCCL Environment
    Variables"; the default, 3, ends the process without aborting them). NCCL kernels do not notice a dead peer:
    without a bounded timeout the other ranks wait in their collectives until the watchdog's 10 minutes pass.

    Raises:
        TrainingFailedError: the process group could not be formed (names the backend error's class).
        BadInputError: ``$DPLORA_COLLECTIVE_TIMEOUT_S`` is not a positive number.
    """
    if int(env.get("WORLD_SIZE", "1") or 1) <= 1:
        return SINGLE
    import torch
    from accelerate import PartialState

    timeout = collective_timeout(env)
    cuda = torch.cuda.is_available()
    if cuda:  # read by ProcessGroupNCCL at creation, so set before the group exists
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    try:
        state = PartialState(cpu=not cuda, timeout=timeout)
    except (RuntimeError, ValueError) as err:
        raise TrainingFailedError(f"cannot join the process group: {err.__class__.__name__}") from err
    return World(
        rank=state.process_index,
        world_size=state.num_processes,
        local_rank=state.local_process_index,
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1") or 1),
        launcher=launcher_name(env),
        backend=str(state.backend),
    )


@contextlib.contextmanager
def gate(world: World):
    """Run a setup stage on every rank, then make every rank raise if any rank failed in it.

    One ``all_gather_object`` after the stage; with one process it does nothing. A rank that failed re-raises its
    own error; the others raise the first failing rank's error class (same exit code) naming that rank.
    """
    if not world.distributed:
        yield
        return
    import torch.distributed as dist

    failure = None
    try:
        yield
    except Exception as err:  # noqa: BLE001 - re-raised below, after the other ranks learn of it
        failure = err
    described = None
    if failure is not None:
        kind = type(failure).__name__ if isinstance(failure, DploraError) else "TrainingFailedError"
        described = (kind, str(failure) if isinstance(failure, DploraError) else type(failure).__name__)
    outcomes: list = [None] * world.world_size
    dist.all_gather_object(outcomes, described)
    if failure is not None:
        raise failure
    failed = next(((r, o) for r, o in enumerate(outcomes) if o is not None), None)
    if failed is not None:
        rank, (kind, message) = failed
        raise getattr(errors, kind, TrainingFailedError)(f"rank {rank}: {message}")


def broadcast(world: World, obj):
    """Rank 0's ``obj`` on every rank (picklable; the plan); with one process, ``obj`` itself."""
    if not world.distributed:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_parameters(world: World, params) -> None:
    """Copy rank 0's values of ``params`` (the trainable LoRA tensors) to every rank, in place."""
    if not world.distributed:
        return
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=0)


def sync_state(world: World, state) -> None:
    """Rank 0's run state on every rank before the first step: LoRA tensors, optimizer state, step counts and
    accountant history (a fresh run's or a restored resume checkpoint's). A no-op for one process.

    The reducer's noise-draw count starts at the steps already taken (each was checked to hold one draw).
    """
    if not world.distributed:
        return
    import torch
    import torch.distributed as dist

    broadcast_parameters(world, [p for _, p in state.named])
    optimizer = state.optimizer.original_optimizer
    box = [None]
    if world.is_main:
        cpu = {
            k: {n: v.detach().cpu() if torch.is_tensor(v) else v for n, v in entry.items()}
            for k, entry in optimizer.state_dict()["state"].items()
        }
        history = list(state.accountant.history)
        box = [{"optimizer": cpu, "step": state.step, "empty_steps": state.empty_steps, "history": history}]
    dist.broadcast_object_list(box, src=0)
    if not world.is_main:
        saved = box[0]
        optimizer.load_state_dict({"state": saved["optimizer"], "param_groups": optimizer.state_dict()["param_groups"]})
        state.step, state.empty_steps = saved["step"], saved["empty_steps"]
        state.accountant.history = [tuple(h) for h in saved["history"]]
    reducer = getattr(state.optimizer, "reducer", None)
    if reducer is not None:
        reducer.noise_draws = state.step


def resume_note(saved_execution: dict, world: World) -> str | None:
    """One line when a resume checkpoint was written by a run on another number of processes, else None."""
    before = int(saved_execution.get("world_size", 1))
    if before == world.world_size:
        return None
    return (
        f"note: the checkpoint was written by a run on {before} process(es); this run uses {world.world_size}. "
        "The mechanism does not depend on it (one Poisson sample at rate q, one noise draw per step, the public "
        f"normaliser); the record states world_size={world.world_size}"
    )


def adapter_digest(model) -> str:
    """sha256 over the adapter state dict peft saves (sorted names, fp32 values): equal iff the adapters are.

    The same function of ``adapter_model.safetensors`` (its tensors by name) gives the same digest.
    """
    from peft import get_peft_model_state_dict

    return state_dict_digest(get_peft_model_state_dict(model))


def state_dict_digest(state: Mapping) -> str:
    """sha256 over (name, little-endian fp32 bytes) of each tensor, names sorted."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode() + b"\0")
        h.update(state[name].detach().float().cpu().contiguous().numpy().astype("<f4").tobytes())
    return h.hexdigest()


def check_agreement(world: World, *, steps: int, digest: str, base_parameters: int | None = None) -> list[dict]:
    """Gather every rank's (accountant steps, adapter digest); all must equal rank 0's.

    Args:
        base_parameters: under ``training.sharding: fsdp``, the base parameters this rank holds (its local shards;
            a property of the public model and W), recorded per rank; None otherwise.

    Returns:
        One dict per rank: ``{"rank", "accountant_steps", "adapter_sha256"}`` (public: the adapters are released),
        with ``"base_parameters_held"`` when given.

    Raises:
        TrainingFailedError: a rank took another number of steps or holds other adapters (no release).
    """
    mine = {"rank": world.rank, "accountant_steps": steps, "adapter_sha256": digest}
    if base_parameters is not None:
        mine["base_parameters_held"] = int(base_parameters)
    if not world.distributed:
        return [mine]
    import torch.distributed as dist

    ranks: list = [None] * world.world_size
    dist.all_gather_object(ranks, mine)
    for other in ranks[1:]:
        if other["accountant_steps"] != ranks[0]["accountant_steps"]:
            raise TrainingFailedError(
                f"rank {other['rank']} accounted {other['accountant_steps']} steps, rank 0 "
                f"{ranks[0]['accountant_steps']}: no release"
            )
        if other["adapter_sha256"] != ranks[0]["adapter_sha256"]:
            raise TrainingFailedError(f"rank {other['rank']} holds other adapters than rank 0: no release")
    return ranks


INPUT_FIELDS = (
    ("data_sha256", "data digest (the training rows' text, in order)"),
    ("num_units", "protected unit count"),
    ("unit_index_sha256", "unit index digest (the records of each unit, in order)"),
    ("contract_sha256", "contract digest"),
    ("plan_sha256", "plan digest"),
    ("base_model_sha256", "base model digest (the sha256 of its config, weight and tokenizer files)"),
    ("examples_sha256", "tokenized examples digest (token ids and loss mask of every record, in order)"),
    ("trainable_sha256", "digest of the trainable LoRA tensors at initialisation"),
    ("versions", "library versions (torch, transformers, peft, opacus, dplora)"),
)


def table_digest(table, columns) -> str:
    """sha256 of the training rows as loaded: each of ``columns`` (sorted by name), every row's value in order.

    ``table`` is the ``datasets.Dataset`` the run trains on (after the held-out split and any appended records);
    read through Arrow (one ``to_pylist`` per column), so 10⁵ rows take well under a second.
    """
    import json

    arrow = table.with_format("arrow")[:]
    h = hashlib.sha256()
    for name in sorted(set(columns)):
        h.update(name.encode("utf-8") + b"\0")
        values = arrow.column(name).to_pylist()
        h.update(json.dumps(values, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def unit_index_digest(unit_index) -> str:
    """sha256 over every unit's record indices (int64, little-endian), each prefixed by its length, unit 0..N-1."""
    h = hashlib.sha256()
    for records in unit_index.records_of_unit:
        rows = np.asarray(records, dtype="<i8")
        h.update(len(rows).to_bytes(8, "little") + rows.tobytes())
    return h.hexdigest()


def input_digests(plan, table, unit_index, *, columns: list[str], contract_sha256: str) -> dict:
    """What every rank must hold alike before step 1 (one short dict; digests only, no private value).

    ``columns`` are the record columns the run reads (:func:`dplora.data.units.required_columns`) and
    ``contract_sha256`` the contract's digest.

    Returns:
        ``{"data_sha256", "num_units", "unit_index_sha256", "contract_sha256", "plan_sha256"}``.
    """
    import json

    plan_json = json.dumps(plan.to_dict(), sort_keys=True, default=str)
    return {
        "data_sha256": table_digest(table, columns),
        "num_units": int(unit_index.num_units),
        "unit_index_sha256": unit_index_digest(unit_index),
        "contract_sha256": contract_sha256,
        "plan_sha256": hashlib.sha256(plan_json.encode("utf-8")).hexdigest(),
    }


def model_digests(base_model: dict, examples, named_trainable) -> dict:
    """What every rank must hold alike once the model is loaded and the records tokenized (before step 1).

    A rank with other weights, another tokenizer, another LoRA initialisation or other library versions computes
    other per-unit gradients for the units it owns (u mod W), so removing one unit would change how every later
    unit is computed: the adapters still agree at the end, only the inputs tell.

    Args:
        base_model: the record's ``base_model`` entry on this rank (:func:`dplora.engine.basefiles.base_model_entry`).
        examples: the tokenized records, a list of (token ids, labels) pairs (tokens).
        named_trainable: [(name, tensor)] of the trainable LoRA tensors, before step 1.

    Returns:
        ``{"base_model_sha256", "examples_sha256", "trainable_sha256", "versions"}`` (digests only).
    """
    import importlib.metadata
    import json

    h = hashlib.sha256()
    for ids, labels in examples:
        h.update(np.asarray(ids, dtype="<i8").tobytes() + b"|" + np.asarray(labels, dtype="<i8").tobytes() + b"\n")
    t = hashlib.sha256()
    for name, p in named_trainable:
        t.update(name.encode("utf-8") + b"\0" + p.detach().float().cpu().numpy().astype("<f4").tobytes())
    versions = {}
    for dist in ("torch", "transformers", "peft", "opacus", "dplora"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    base = json.dumps({"files": base_model.get("files"), "package": base_model.get("package")}, sort_keys=True)
    return {
        "base_model_sha256": hashlib.sha256(base.encode("utf-8")).hexdigest(),
        "examples_sha256": h.hexdigest(),
        "trainable_sha256": t.hexdigest(),
        "versions": versions,
    }


def disagreement(gathered: list[dict]) -> str | None:
    """One line naming the first rank whose inputs differ from rank 0's and every field that differs, or None."""
    for rank, mine in enumerate(gathered[1:], start=1):
        differ = [words for key, words in INPUT_FIELDS if mine.get(key) != gathered[0].get(key)]
        if differ:
            counts = ""
            if mine.get("num_units") != gathered[0].get("num_units"):
                counts = f" ({mine.get('num_units')} units on rank {rank}, {gathered[0].get('num_units')} on rank 0)"
            return (
                f"the ranks disagree before step 1: rank {rank}'s {', '.join(differ)} differ from rank 0's{counts}; "
                "every process must read the same data (the same rows in the same order) with the same contract, "
                "model files and library versions; no run, no release"
            )
    return None


def check_same_inputs(world: World, digests: dict) -> None:
    """All-gather every rank's :func:`input_digests` and stop every rank unless all equal rank 0's.

    Each rank loads and indexes its own copy of ``data.path`` and owns the units u mod W of its own order: a rank
    that read other rows, or the same rows in another order, would share units with another rank and leave others
    unsampled (sensitivity 2C). One ``all_gather_object`` before step 1; with one process, nothing.

    Raises:
        BadInputError: on every rank, the same line naming the first differing rank and fields (exit 2: the data or
            contract given to the processes differ; found before the model loads, the ledger is charged or
            anything is written).
    """
    if not world.distributed:
        return
    import torch.distributed as dist

    gathered: list = [None] * world.world_size
    dist.all_gather_object(gathered, digests)
    message = disagreement(gathered)
    if message is not None:
        raise BadInputError(message)


def execution_entry(world: World, noise_draws: int | None, ranks: list[dict] | None) -> dict:
    """The release record's world size and launcher, and with W processes ``distributed`` (public): backend,
    sharding, sampling, reduction, noise, the run's total noise draws over all ranks (``noise_draws``: the step
    reducer's count, None without one), each rank's steps and digest.
    """
    entry: dict = {"world_size": world.world_size, "launcher": world.launcher}
    if not world.distributed:
        return entry
    entry["distributed"] = {
        "backend": world.backend,
        "sharding": SHARDING,
        "sampling": SAMPLING,
        "reduction": "one all-reduce (sum) of the per-rank clipped sums per logical step",
        "noise": NOISE,
        "noise_draws": noise_draws,
        "normalizer": "the public expected units per step over all ranks (unchanged by the world size)",
        "ranks": ranks or [],
    }
    return entry


def ensure_process_group(world: World, device) -> None:
    """FSDP needs a process group even for one process: create a single-rank one (in-memory store) if none exists.

    A group created here is dplora's own: :func:`finish` leaves it, and so does an ``atexit`` hook for commands
    that never call :func:`finish` (``budget --estimate``, ``clip-guide``).

    Args:
        world: the run's processes; with W > 1 the launcher's group already exists.
        device: the run's device (nccl on CUDA, gloo on CPU).
    """
    global _OWN_GROUP
    import torch
    import torch.distributed as dist

    if dist.is_initialized() or world.distributed:
        return
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    _OWN_GROUP = dist.group.WORLD


_OWN_GROUP = None  # the single-rank group ensure_process_group made (None: none, or it was left)


def finish(world: World) -> None:
    """Leave the process group: the launcher's (W > 1) or the single-rank one :func:`ensure_process_group` made.

    The model is freed first (``gc.collect``): a peft-wrapped FSDP2 model is cyclic garbage once the run returns,
    and its sharded tensors hold the group. Collected after the group is destroyed (at interpreter exit, say), gloo
    aborts the process with ``terminate called without an active exception`` (SIGABRT): under ``torchrun`` that is
    a failed rank after a successful run. A no-op without a group, or for a group this process did not make.
    """
    global _OWN_GROUP
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        _OWN_GROUP = None
        return
    own = _OWN_GROUP is not None and dist.group.WORLD is _OWN_GROUP  # not a group the caller made after ours
    _OWN_GROUP = None
    if world.distributed or own:
        gc.collect()
        dist.destroy_process_group()


atexit.register(finish, SINGLE)  # leaves the single-rank group of a command that never calls finish (else a no-op)
