"""Benchmark: cost of a resume checkpoint on the demo setup (SmolLM2-135M, LoRA r=8 on q_proj/v_proj, AdamW).

Builds the run as ``dplora train configs/demo.yaml`` does (packaged model, generated tickets), takes two real
logical steps (small batches, so the optimizer state exists), then times :func:`dplora.run.checkpoint.write` (tensors
to the host, safetensors, fsync, rename) and :func:`dplora.run.checkpoint.restore`, and reports the file size.
Writes only into a temporary folder.

    .venv/bin/python scripts/bench_checkpoint.py [--repeat 5] [--threads N]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    from dplora.contract.loader import load_contract
    from dplora.data import units as data
    from dplora.data.demo import write_tickets
    from dplora.plan import resolve as planning
    from dplora.recipe import build
    from dplora.recipe.config import RunOptions, compile_run
    from dplora.run import checkpoint
    from dplora.run.loop import run_steps

    with tempfile.TemporaryDirectory(prefix="dplora-bench-ckpt-") as tmp:
        tmp = Path(tmp)
        write_tickets(tmp / "tickets.csv", num_tickets=200, seed=0)
        contract = load_contract(
            ROOT / "configs" / "demo.yaml",
            [f"data.path={tmp / 'tickets.csv'}", f"training.output_dir={tmp / 'run'}", "training.steps=2"]
            + ["training.expected_batch_size=2", "training.physical_batch_size=2", "privacy.accountant=rdp"],
        )
        table = data.load_table(contract.data, unit_key=contract.privacy.unit_key)
        unit_index = data.build_unit_index(table, contract.privacy, seed=contract.training.seed)
        plan = planning.plan_for(contract, unit_index)
        config = compile_run(contract, plan, RunOptions(threads=args.threads, progress=False))
        staging = tmp / "run.partial"
        staging.mkdir()
        spec, state = build.build_run(
            config, contract.data, table, unit_index, out=tmp / "run", staging=staging, log=lambda *_: None
        )
        run_steps(spec, state, metrics=io.StringIO(), progress=type("P", (), {"update": lambda *a: None})())
        digest = checkpoint.data_sha256(contract.data)
        writes, restores = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            info = checkpoint.write(spec, state, started_at="bench", data_digest=digest)
            writes.append(time.perf_counter() - t0)
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            checkpoint.restore(spec, state, info)
            restores.append(time.perf_counter() - t0)
        lora = sum(p.numel() for _, p in state.named)
        print(
            json.dumps(
                {
                    "model": "smollm2-135m (LoRA r=8 q_proj,v_proj, AdamW)",
                    "lora_parameters": lora,
                    "checkpoint_bytes": info.path.stat().st_size,
                    "write_seconds_median": round(statistics.median(writes), 4),
                    "restore_seconds_median": round(statistics.median(restores), 4),
                    "threads": spec.threads,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
