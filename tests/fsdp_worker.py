"""One process of tests/engine/test_fsdp.py: ``dplora train`` on each given contract with two TEST-ONLY seams.

``python fsdp_worker.py OUT KEY DIR0 DIR1 NAME=CONTRACT ...`` (alone, or as each rank of ``torchrun``): rank r works
in DIR r (the contracts' relative ``data.path`` is read there, as on two machines) and trains each contract in turn,
writing ``OUT/<NAME>-rank<r>.json`` with its exit code. Under torchrun give ONE contract per launch (a run leaves
its process group at the end).

The seams (never reachable from a contract or the CLI; they exist only in this test process):
- the sampler: step k samples the units :data:`SCHEDULE` [k] (global indices); under W ranks each rank takes its own
  shard of them (u mod W == rank), as the sharded Poisson sampler would, so one process and W ranks see the same units;
- the noise: draw d is N(0, (σC)²) from ``torch.Generator().manual_seed(1000 + d)``, the same vector in one
  process (its one draw per step) as on rank 0 of W ranks (the step's one draw);
- ``$FSDP_WORKER_FAIL`` = ``RANK:STEP`` (read here only): that rank's first clipping into the per-unit sum of logical
  step STEP raises ``RuntimeError`` (between two collective forwards), and the rank's result file also gets
  ``failed_at`` (its ``time.time()``); every result file gets ``exited_at``, and a rank whose run failed exits
  with its code (as ``dplora`` does).
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

# Global units of each logical step: ranks get different numbers of units and physical batches (rank 1 none at
# step 3, rank 0 fewer at step 4), and step 2 is empty everywhere.
SCHEDULE = [[0, 1, 2, 3, 4, 6, 8], [], [2, 4], [1, 3, 5, 7, 9, 11, 0], [5, 10]]


class FixedSampler:
    """:data:`SCHEDULE` in turn, this rank's shard of it (the test seam for ``unit_sampler``)."""

    def __init__(self, num_units: int, sample_rate: float, world):
        self.world, self.step = world, 0

    def sample(self) -> np.ndarray:
        units = np.array(SCHEDULE[self.step % len(SCHEDULE)], dtype=np.int64)
        self.step += 1
        if self.world.distributed:
            units = units[units % self.world.world_size == self.world.rank]
        return np.sort(units)


class FixedNoise:
    """Draw d: N(0, std²) from a torch generator seeded 1000 + d (the test seam for the OS-entropy generator)."""

    def __init__(self):
        self.draws = 0

    def normal(self, size: int, std: float, *, device="cpu") -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 + self.draws)
        self.draws += 1
        return (torch.randn(size, generator=g, dtype=torch.float64) * std).float().to(device)


def main(out: Path, key: str, dirs: list[str], runs: list[str]) -> None:
    warnings.filterwarnings("ignore")
    rank = int(os.environ.get("RANK", "0"))
    os.chdir(dirs[rank])
    from dplora.cli.app import app
    from dplora.mechanism import core, optimizer

    core.unit_sampler = FixedSampler
    optimizer.os_entropy_generator = FixedNoise
    seen = {}
    fail = os.environ.get("FSDP_WORKER_FAIL")
    if fail:
        fail_rank, fail_step = (int(v) for v in fail.split(":"))
        cls = optimizer.UnitDPOptimizer
        begin, accumulate = cls.begin_logical_step, cls.accumulate

        def counted_begin(self, *args, **kwargs):
            seen["step"] = seen.get("step", 0) + 1
            return begin(self, *args, **kwargs)

        def failing_accumulate(self, *args, **kwargs):
            if rank == fail_rank and seen.get("step") == fail_step and "failed_at" not in seen:
                seen["failed_at"] = time.time()
                raise RuntimeError("injected failure of one rank's clipping")
            return accumulate(self, *args, **kwargs)

        cls.begin_logical_step, cls.accumulate = counted_begin, failing_accumulate
    for run in runs:
        name, contract = run.split("=", 1)
        try:
            app(["train", contract, "--signing-key", key, "--no-progress", "--overwrite"])
            code = 0
        except SystemExit as exc:
            code = exc.code
        result = {"exit_code": code, "exited_at": time.time()}
        if "failed_at" in seen:
            result["failed_at"] = seen["failed_at"]
        (out / f"{name}-rank{rank}.json").write_text(json.dumps(result))
        if fail and code:
            sys.exit(code)  # as ``dplora`` itself exits, so that torchrun reports the failed ranks


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:5], sys.argv[5:])
