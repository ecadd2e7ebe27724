"""Benchmark: DP-LoRA step time against non-private LoRA on the same batches, in one process.

Reports examples/s for each mode and the time ratio DP / non-DP, measured in the same run (interleaved
rounds, after one warm-up step each), on fake generated tickets (no private data).

    .venv/bin/python scripts/bench_overhead.py --model smollm2-135m --steps 4 --batch 8 --seq 64
    .venv/bin/python scripts/bench_overhead.py --model path/to/hf-folder
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch

from dplora.contract.spec import ModelSection
from dplora.data.demo import generate_tickets
from dplora.engine import batch as batching
from dplora.engine import runtime
from dplora.engine.model import load_model_and_tokenizer
from dplora.mechanism import optimizer as dpopt


def _lora(model_section, r):
    from peft import LoraConfig, get_peft_model

    model, tok = load_model_and_tokenizer(model_section, log=lambda _: None)
    torch.manual_seed(0)
    cfg = LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, cfg)
    peft_model.train()
    return peft_model, tok


def _batches(tok, n, batch, seq):
    rows = generate_tickets(num_tickets=n * batch, seed=7)
    out = []
    for i in range(n):
        ex = []
        for r in rows[i * batch : (i + 1) * batch]:
            ids = tok(f"{r['message']}\n{r['reply']}", add_special_tokens=False)["input_ids"][:seq]
            ex.append((ids, ids))
        out.append(batching.collate(ex, tok.pad_token_id))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="packaged name or a local HF folder")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per mode and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="examples per step")
    ap.add_argument("--seq", type=int, default=64, help="tokens per example")
    ap.add_argument("--r", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    threads = args.threads or runtime.free_threads()
    torch.set_num_threads(threads)
    section = ModelSection(name=args.model) if args.model == "smollm2-135m" else ModelSection(path=args.model)

    plain, tok = _lora(section, args.r)
    plain_opt = torch.optim.AdamW([p for p in plain.parameters() if p.requires_grad], lr=1e-3)
    dp_model, _ = _lora(section, args.r)
    params = [p for p in dp_model.parameters() if p.requires_grad]
    plan = type(
        "P", (), {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "expected_batch_size": args.batch, "sample_rate": 0.01}
    )()
    gsm, dp_opt, _ = dpopt.make_private(dp_model, torch.optim.AdamW(params, lr=1e-3), plan=plan, unit_mean=False)
    batches = _batches(tok, args.steps + 1, args.batch, args.seq)

    def plain_step(b):
        batching.per_sequence_loss(plain, b).mean().backward()
        plain_opt.step()
        plain_opt.zero_grad(set_to_none=True)

    def dp_step(b):
        dp_opt.begin_logical_step(args.batch)
        batching.per_sequence_loss(gsm, b).sum().backward()
        dp_opt.accumulate(torch.arange(args.batch))
        dp_opt.step()
        dp_opt.zero_grad(set_to_none=True)

    times = {"non_dp": [], "dp": []}
    plain_step(batches[0])
    dp_step(batches[0])
    for _ in range(args.rounds):
        for name, fn in (("non_dp", plain_step), ("dp", dp_step)):
            t0 = time.perf_counter()
            for b in batches[1:]:
                fn(b)
            times[name].append((time.perf_counter() - t0) / args.steps)
    per = {k: statistics.median(v) for k, v in times.items()}
    report = {
        "model": args.model,
        "threads": threads,
        "batch": args.batch,
        "seq": args.seq,
        "lora_r": args.r,
        "trainable_params": sum(p.numel() for p in params),
        "seconds_per_step": {k: round(v, 3) for k, v in per.items()},
        "examples_per_s": {k: round(args.batch / v, 2) for k, v in per.items()},
        "time_ratio_dp_over_non_dp": round(per["dp"] / per["non_dp"], 3),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
