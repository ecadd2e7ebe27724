"""One rank of the 2-process checks in tests/engine/test_distributed.py, started by ``torchrun --nproc-per-node 2``.

``python dist_worker.py OUT [CONFIG --signing-key KEY --ledger DB]`` runs, on every rank, over gloo:
  1. the sharded Poisson sampler for many steps (no model): every rank's inclusion indicators, gathered;
  2. the same with both ranks' generators seeded alike (what the test must catch);
  3. the step reduction on zero clipped sums: the reduced output is the noise alone;
  4. the reduction with two ranks that both think they are rank 0 (two draws: it must refuse), and a failure on
     rank 1 inside a step's reduction and inside a setup gate (every rank must raise);
  5. one logical step with σ = 0 on a tiny LoRA Llama, distributed (each rank its shard of the sampled units),
     next to the single-process step and a brute-force reference on rank 0 (fast and Opacus paths);
  6. with more arguments, ``dplora train ARGS --resume`` on both ranks: the test interrupted that run (one
     process) and the two ranks finish it from its resume checkpoint.
Rank 0 writes the raw results to OUT/results.npz and OUT/results.json; the test computes every statistic.
"""

from __future__ import annotations

import copy
import json
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist

from dplora.engine import batch as batching
from dplora.engine import distributed
from dplora.errors import BadInputError, TrainingFailedError
from dplora.mechanism import optimizer as dpopt
from dplora.mechanism import reduction, sampling
from dplora.mechanism.clipping import UnitClipAccumulator

N_UNITS, RATE, SAMPLER_STEPS = 100, 0.1, 400  # shards of 50 units: ranks seeded alike draw alike
NOISE_P, NOISE_STEPS, SIGMA, CLIP = 256, 200, 1.3, 0.5
PAD = 256


def _indicators(world, sampler, steps: int) -> np.ndarray:
    """(steps, W, N) 0/1: which units each rank sampled at each step (all-gathered to every rank)."""
    out = np.zeros((steps, world.world_size, N_UNITS), dtype=np.int8)
    for s in range(steps):
        mine = torch.zeros(N_UNITS, dtype=torch.int32)
        mine[torch.as_tensor(sampler.sample(), dtype=torch.long)] = 1
        gathered = [torch.zeros_like(mine) for _ in range(world.world_size)]
        dist.all_gather(gathered, mine)
        out[s] = torch.stack(gathered).numpy()
    return out


def _noise_only(world) -> tuple[np.ndarray, list[float], int, bool]:
    """Reduced outputs (steps, P) of zero clipped sums with E = 1, per-step draw totals, the run's draws, and
    whether every rank got the same output."""
    reducer = reduction.StepReducer(world, NOISE_P, "cpu")
    acc = UnitClipAccumulator(NOISE_P, CLIP, "cpu")
    gen = dpopt.os_entropy_generator()
    outputs, draws = [], []
    for _ in range(NOISE_STEPS):
        acc.begin_step()
        outputs.append(
            reducer.privatize(acc, noise_multiplier=SIGMA, max_grad_norm=CLIP, expected_batch_size=1.0, generator=gen)
        )
        draws.append(reducer.totals["noise_draws"])
    mine = torch.stack(outputs)
    other = [torch.zeros_like(mine) for _ in range(world.world_size)]
    dist.all_gather(other, mine)
    same = all(torch.equal(o, other[0]) for o in other)
    return mine.numpy(), draws, reducer.noise_draws, same


def _privatize_nothing(reducer) -> torch.Tensor:
    """The reduction of an 8-value accumulator with no units added: σ = C = E = 1, OS-entropy noise."""
    acc = UnitClipAccumulator(8, 1.0, "cpu")
    return reducer.privatize(
        acc, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=1.0, generator=dpopt.os_entropy_generator()
    )


def _two_draws(world) -> str:
    """Both ranks act as rank 0 (each draws): the reduction must refuse the step on every rank."""
    liar = distributed.World(rank=0, world_size=world.world_size, launcher="test", backend="gloo")
    reducer = reduction.StepReducer(liar, 8, "cpu")
    try:
        _privatize_nothing(reducer)
    except TrainingFailedError as err:
        return str(err)
    return "accepted"


def _failures_reach_every_rank(world) -> dict:
    """Rank 1 fails inside a step's reduction and inside a setup gate: what each rank raises (class, message)."""
    out = {}
    reducer = reduction.StepReducer(world, 8, "cpu")
    if world.rank == 1:
        reducer.fail(TrainingFailedError("non-finite loss at logical step 3: stopping without a release"))
    try:
        _privatize_nothing(reducer)
        out["step"] = ["none", ""]
    except TrainingFailedError as err:
        out["step"] = [type(err).__name__, str(err)]
    try:
        with distributed.gate(world):
            if world.rank == 1:
                raise BadInputError("data file x.csv has no rows")
        out["gate"] = ["none", ""]
    except BadInputError as err:
        out["gate"] = [type(err).__name__, str(err)]
    gathered = [None] * world.world_size
    dist.all_gather_object(gathered, out)
    return gathered


# --------------------------------------------------------------------------- one step on a tiny LoRA model

# Records (input_ids, labels) and units of 1-3 records; C is small enough that most units are clipped.
RECORDS = [
    ([1, 2, 3, 4, 5], [-100, -100, 3, 4, 5]),
    ([6, 7, 8], [6, 7, 8]),
    ([9, 10, 11, 12, 13, 14, 15], [9, 10, 11, 12, 13, 14, 15]),
    ([20, 21], [20, 21]),
    ([40, 41, 42, 43], [40, 41, 42, 43]),
    ([50, 51, 52, 53, 54, 55], [-100, 51, 52, 53, 54, 55]),
    ([60, 61, 62], [60, 61, 62]),
    ([70, 71, 72, 73, 74], [70, 71, 72, 73, 74]),
    ([80, 81, 82, 83], [-100, -100, 82, 83]),
    ([90, 91, 92], [90, 91, 92]),
    ([100, 101, 102, 103], [100, 101, 102, 103]),
    ([110, 111], [110, 111]),
]
UNITS = [[0, 1], [2], [3, 4, 5], [6], [7, 8], [9], [10, 11]]  # 7 units over 12 records
SAMPLED = np.array([0, 2, 3, 4, 6])  # the step's units: rank 0 holds 0, 2, 4, 6; rank 1 holds 3
STEP_CLIP, STEP_E = 0.05, 4.0


def _lora_model():
    from support.physical_batch import shared_model  # r = 4 on q_proj and v_proj, lora_B ~ N(0, 0.3²) from seed 1

    return shared_model()


def _one_step(model, units, per_sample: str, world) -> tuple[torch.Tensor, int]:
    """(−Δθ·E, flat: the clipped sum over all ranks' units, one SGD(lr=1) step of dplora.run.loop; steps counted)."""
    from dplora.run.loop import RunState, logical_step

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    before = torch.cat([p.detach().reshape(-1).clone() for _, p in named])
    reducer = reduction.StepReducer(world, before.numel(), "cpu") if world.distributed else None
    optimizer = torch.optim.SGD([p for _, p in named], lr=1.0)
    plan = SimpleNamespace(noise_multiplier=0.0, max_grad_norm=STEP_CLIP, expected_batch_size=STEP_E, sample_rate=0.5)
    gsm, dp_opt, acc = dpopt.make_private(
        model, optimizer, plan=plan, unit_mean=False, per_sample=per_sample, reducer=reducer
    )
    spec = SimpleNamespace(
        unit_index=SimpleNamespace(records_of_unit=tuple(np.array(u) for u in UNITS)),
        physical_batch_size=2,  # units span physical batches
        examples=RECORDS,
        pad_id=PAD,
        device=torch.device("cpu"),
        config=SimpleNamespace(sharded_base=False),
    )
    logical_step(spec, RunState(model=gsm, optimizer=dp_opt, accountant=acc, named=named), units)
    after = torch.cat([p.detach().reshape(-1) for _, p in named])
    return (before - after) * STEP_E, acc.steps


def _brute_force(model, units) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ_units clip_C(Σ of the unit's records' own batch-1 gradients), flat float64; each unit's norm before)."""
    total, norms = None, []
    for u in units:
        unit_sum = None
        for r in UNITS[u]:
            model.zero_grad(set_to_none=True)
            batching.per_sequence_loss(model, batching.collate([RECORDS[r]], PAD)).sum().backward()
            g = torch.cat([p.grad.reshape(-1).double() for _, p in model.named_parameters() if p.requires_grad])
            unit_sum = g if unit_sum is None else unit_sum + g
        norms.append(float(unit_sum.norm()))
        clipped = unit_sum * min(1.0, STEP_CLIP / norms[-1])
        total = clipped if total is None else total + clipped
    return total, torch.tensor(norms)


def _model_step(world) -> dict:
    pristine = _lora_model()
    shard = sampling.shard_units(len(UNITS), world)
    mine = np.intersect1d(SAMPLED, shard)
    out = {}
    for path in ("fast", "opacus"):
        dist_sum, dist_steps = _one_step(copy.deepcopy(pristine), mine, path, world)
        gathered = [torch.zeros_like(dist_sum) for _ in range(world.world_size)]
        dist.all_gather(gathered, dist_sum)
        out[f"{path}_ranks_equal"] = all(torch.equal(g, gathered[0]) for g in gathered)
        out[f"{path}_dist"] = dist_sum.numpy()
        out[f"{path}_dist_steps"] = dist_steps
        if world.is_main:
            single, _ = _one_step(copy.deepcopy(pristine), SAMPLED, path, distributed.SINGLE)
            out[f"{path}_single"] = single.numpy()
    if world.is_main:
        brute, norms = _brute_force(copy.deepcopy(pristine), SAMPLED)
        out["brute"], out["unit_norms"] = brute.numpy(), norms.numpy()
        out["rank_units"] = [int(u) for u in mine]
    return out


def main(folder: Path, resume_args: list[str]) -> None:
    warnings.filterwarnings("ignore")  # Opacus/transformers notices on a frozen base; stderr stays readable
    world = distributed.init_world()
    torch.set_num_threads(1)
    real = _indicators(world, sampling.ShardedPoissonSampler(N_UNITS, RATE, world), SAMPLER_STEPS)
    shared_rng = np.random.default_rng(1234)  # the defect the test must catch: ranks seeded alike
    shared = _indicators(world, sampling.ShardedPoissonSampler(N_UNITS, RATE, world, shared_rng), SAMPLER_STEPS)
    noise, draws, run_draws, noise_same = _noise_only(world)
    refused = _two_draws(world)
    failures = _failures_reach_every_rank(world)
    step = _model_step(world)
    if world.is_main:
        arrays = {k: v for k, v in step.items() if isinstance(v, np.ndarray)}
        np.savez(folder / "results.npz", real=real, shared=shared, noise=noise, **arrays)
        summary = {k: v for k, v in step.items() if not isinstance(v, np.ndarray)}
        summary.update(
            world_size=world.world_size,
            launcher=world.launcher,
            backend=world.backend,
            step_draws=draws,
            run_draws=run_draws,
            noise_same_on_ranks=noise_same,
            two_draws=refused,
            failures=failures,
            shards=[sampling.shard_units(N_UNITS, distributed.World(rank=r, world_size=2)).tolist() for r in (0, 1)],
        )
        (folder / "results.json").write_text(json.dumps(summary))
    if resume_args:
        _resume(world, folder, resume_args)
    distributed.finish(world)


def _resume(world, folder: Path, args: list[str]) -> None:
    """``dplora train CONFIG --resume ...`` on both ranks, in this process group (the CLI joins it); exit codes."""
    from dplora.cli.app import app

    try:
        app(["train", *args, "--resume", "--no-progress"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    if world.is_main:
        (folder / "resume_exit.json").write_text(json.dumps({"rank0": code}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
