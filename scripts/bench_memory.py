"""Peak memory of ONE logical step against its size: 256, 1,024 and 4,096 records, in fresh processes (CPU).

Wide LoRA (r=16 on all 7 projections) on a small-but-wide random Llama (hidden 128, 2 layers), sequence 32,
physical batch 32, units of 1–5 records (ticket-like) plus one unit of 45 records that spans two physical
batches. Both per-sample paths run through the engine (``dpopt.make_private``, ``UnitDPOptimizer``, whose
:class:`dplora.mechanism.clipping.UnitClipAccumulator` keeps one running clipped sum and at most one open unit):
  fast    FlatLoRAGrads writes each record's LoRA gradient into one (B, P) buffer
  opacus  Opacus hooks' grad_sample, copied into the same (B, P) layout
Each process builds the model, runs a warm-up logical step of 32 records, then the measured step, and reports its
peak RSS (getrusage ru_maxrss) and its RSS before the measured step.

    python scripts/bench_memory.py [--rows 256 1024 4096] [--paths fast opacus] [--out DIR]

Before issue 11 the engine held one gradient vector per sampled unit for the whole logical step; measured with this
script then (same model, 1 thread): peak RSS 517, 596, 883 MiB at 256, 1,024, 4,096 records (1.71×).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ALL_7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SEQ, PHYSICAL = 32, 32


def _rss_now() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _units(rows: int) -> list[int]:
    """Unit id of each record: sizes 1,2,3,5,4,... and one 45-record unit early on; exactly ``rows`` records."""
    sizes, total, i = [], 0, 0
    while total < rows:
        size = 45 if i == 3 else [1, 2, 3, 5, 4][i % 5]
        size = min(size, rows - total)
        sizes.append(size)
        total += size
        i += 1
    return [u for u, s in enumerate(sizes) for _ in range(s)]


def _model():
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=16, lora_alpha=32, target_modules=ALL_7))
    model.train()
    return model


def _batch(unit_rows: list[int], gen):
    import torch

    from dplora.engine import batch as batching

    records = []
    for _ in unit_rows:
        length = int(torch.randint(SEQ // 2, SEQ + 1, (1,), generator=gen))
        ids = torch.randint(1, 512, (length,), generator=gen).tolist()
        records.append((ids, [batching.IGNORE_INDEX] * 4 + ids[4:]))
    return batching.collate(records, pad_id=0)


def _step(model, dp_opt, unit_of_row, gen):
    """One logical step through the engine: records of each unit contiguous, cut into physical batches."""
    import torch

    from dplora.engine import batch as batching

    dp_opt.begin_logical_step()
    for start in range(0, len(unit_of_row), PHYSICAL):
        chunk = unit_of_row[start : start + PHYSICAL]
        continues = start + PHYSICAL < len(unit_of_row) and unit_of_row[start + PHYSICAL] == chunk[-1]
        dp_opt.prepare_batch(len(chunk))
        batching.per_sequence_loss(model, _batch(chunk, gen)).sum().backward()
        dp_opt.accumulate(torch.tensor(chunk), continues=continues)
    dp_opt.step()
    dp_opt.zero_grad(set_to_none=True)


def worker(path: str, rows: int, threads: int) -> dict:
    import warnings
    from types import SimpleNamespace

    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    model = _model()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    warm = list(range(PHYSICAL))
    measured = [u + 10**6 for u in _units(rows)]
    from dplora.mechanism import optimizer as dpopt

    plan = SimpleNamespace(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=100, sample_rate=0.01)
    forward, dp_opt, _ = dpopt.make_private(model, optimizer, plan=plan, unit_mean=False, per_sample=path)
    _step(forward, dp_opt, warm, gen)
    start, t0 = _rss_now(), time.perf_counter()
    _step(forward, dp_opt, measured, gen)
    return dict(
        path=path,
        rows=rows,
        units=len(set(measured)),
        lora_params=sum(p.numel() for p in params),
        seconds=time.perf_counter() - t0,
        rss_before_step_mib=start / 2**20,
        peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--paths", nargs="+", default=["fast", "opacus"], choices=["fast", "opacus"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="write memory.json and memory.md here")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker[0], int(args.worker[1]), args.threads)), flush=True)
        return
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    results = []
    for path in args.paths:
        for rows in args.rows:
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", path, str(rows), "--threads", str(args.threads)],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            got = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if not got:
                print(f"{path} {rows}: failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}", flush=True)
                continue
            results.append(got[0])
            print(json.dumps(got[0]), flush=True)
    lines = [
        f"One logical step, wide LoRA, seq {SEQ}, physical batch {PHYSICAL}, CPU, {args.threads} thread(s)",
        "",
        "| path | records | units | LoRA params | RSS before step MiB | peak RSS MiB | peak × smallest | step s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in args.paths:
        mine = [r for r in results if r["path"] == path]
        for r in mine:
            ratio = r["peak_rss_mib"] / mine[0]["peak_rss_mib"]
            lines.append(
                f"| {path} | {r['rows']} | {r['units']} | {r['lora_params']:,} | {r['rss_before_step_mib']:.0f} | "
                f"{r['peak_rss_mib']:.0f} | {ratio:.3f} | {r['seconds']:.1f} |"
            )
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "memory.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "memory.md").write_text(table)


if __name__ == "__main__":
    main()
