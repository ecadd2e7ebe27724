"""One process of tests/slow/engine/test_fsdp_attacks.py: ``dplora train`` under TEST-ONLY seams set by
``$FSDP_SEAMS``.

``python fsdp_seams_worker.py OUT DIR0 DIR1 ARGS...`` (alone, or as each rank of ``torchrun``): rank r works in DIR r,
runs ``dplora ARGS`` and writes ``OUT/rank<r>.json`` (exit code, last message) and, per logical step,
``OUT/steps-rank<r>.jsonl`` (this rank's units, physical forwards, padding forwards, adapter digest).

``$FSDP_SEAMS`` is a JSON object; every key is optional (none of these is reachable from a contract or the CLI):
- ``schedule``: global units per step (each rank takes u mod W, as the sharded sampler does); absent: the real
  Poisson sampler;
- ``fixed_noise``: d0, an integer: draw d (from d0 on) is N(0, (σC)²) from ``torch.Generator().manual_seed(1000 + d)``
  (absent: OS entropy); a resumed launch passes the checkpoint's step, as it passes the schedule's remaining steps;
- ``fail``: ``[rank, step, forward]``: that rank's real forward number ``forward`` (1-based) of ``step`` raises;
- ``sigterm``: ``[rank, step]``: that rank sends itself SIGTERM after ``step``;
- ``nan_padding``: every padding forward's loss is multiplied by NaN, so a padding row that reached any sum would
  poison the update (the discarded rows must never be read into a unit);
- ``dump``: write this rank's trainable LoRA tensors, flat fp32, before step 1 and after every step
  (``OUT/params-rank<r>.npz``: ``pre`` and ``step<k>``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import warnings
from pathlib import Path

from workers_common import run_app_and_record


def main(out: Path, dirs: list[str], args: list[str]) -> None:
    warnings.filterwarnings("ignore")
    rank = int(os.environ.get("RANK", "0"))
    os.chdir(dirs[rank])
    cfg = json.loads(os.environ.get("FSDP_SEAMS", "{}"))

    import numpy as np
    import torch

    from dplora.cli.app import app
    from dplora.engine import batch as batching
    from dplora.engine import distributed
    from dplora.mechanism import core, optimizer
    from dplora.run import loop

    if cfg.get("schedule") is not None:
        schedule = cfg["schedule"]

        class FixedSampler:
            def __init__(self, num_units, sample_rate, world):
                self.world, self.step = world, 0

            def sample(self):
                units = np.array(schedule[self.step % len(schedule)], dtype=np.int64)
                self.step += 1
                if self.world.distributed:
                    units = units[units % self.world.world_size == self.world.rank]
                return np.sort(units)

        core.unit_sampler = FixedSampler

    if cfg.get("fixed_noise") is not None:

        class FixedNoise:
            def __init__(self):
                self.draws = int(cfg["fixed_noise"])  # a resumed launch passes its checkpoint's step

            def normal(self, size, std, *, device="cpu"):
                g = torch.Generator().manual_seed(1000 + self.draws)
                self.draws += 1
                return (torch.randn(size, generator=g, dtype=torch.float64) * std).float().to(device)

        optimizer.os_entropy_generator = FixedNoise

    counts = {"step": 0, "forwards": 0, "padding": 0}
    real_loss = batching.per_sequence_loss
    fail = cfg.get("fail")

    def counted_loss(model, batch):
        if batch["input_ids"].shape == (1, 2) and bool((batch["labels"] == batching.IGNORE_INDEX).all()):
            counts["padding"] += 1
            if cfg.get("nan_padding"):
                return real_loss(model, batch) * float("nan")
        else:
            counts["forwards"] += 1
            if fail and fail[0] == rank and fail[1] == counts["step"] and fail[2] == counts["forwards"]:
                raise RuntimeError("injected failure of one rank's forward")
        return real_loss(model, batch)

    batching.per_sequence_loss = counted_loss
    real_step = loop.logical_step
    log = out / f"steps-rank{rank}.jsonl"
    sigterm = cfg.get("sigterm")

    dumped = {}

    def flat(state):
        return torch.cat([p.detach().float().reshape(-1) for _, p in state.named]).numpy().copy()

    def logged_step(spec, state, units):
        counts.update(step=state.step + 1, forwards=0, padding=0)
        if cfg.get("dump") and not dumped:
            dumped["pre"] = flat(state)
        result = real_step(spec, state, units)
        if cfg.get("dump"):
            dumped[f"step{state.step + 1}"] = flat(state)
            np.savez(out / f"params-rank{rank}.npz", **dumped)
        entry = {
            "step": state.step + 1,
            "units": [int(u) for u in units],
            "rows": [int(r) for r in loop._batches(spec, units)[0]],
            "forwards": counts["forwards"],
            "padding": counts["padding"],
            "digest": distributed.state_dict_digest({n: p for n, p in state.named}),
        }
        with log.open("a") as fh:
            fh.write(json.dumps(entry) + "\n")
        if sigterm and sigterm[0] == rank and sigterm[1] == state.step + 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    loop.logical_step = logged_step
    run_app_and_record(app, args, out, rank)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:4], sys.argv[4:])
