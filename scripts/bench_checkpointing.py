"""Peak memory with and without gradient checkpointing, DP-fast against non-DP LoRA, at 512 and 2,048 tokens (CPU).

A random Llama stand-in (hidden 256, 4 layers, 4 heads, vocab 258), LoRA r=8 on q_proj, v_proj, physical batch 2,
fp32, 1 thread. Each measurement is a fresh process (subprocess) that builds the model, runs one step and reports
its peak RSS (getrusage ru_maxrss):
  nondp   plain peft LoRA: summed backward, SGD step
  dp      dplora's fast path through the engine (dpopt.make_private: FlatLoRAGrads, per-unit clipping, noise,
          accountant step)
with ``gradient_checkpointing`` off and on (transformers, non-reentrant, as ``training.gradient_checkpointing``).

    python scripts/bench_checkpointing.py [--seq 512 2048] [--batch 2] [--layers 4]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import types
from pathlib import Path


def _child(mode: str, checkpointing: bool, seq: int, batch: int, layers: int) -> dict:
    import warnings

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from dplora.engine import batch as batching
    from dplora.engine.model import enable_gradient_checkpointing
    from dplora.mechanism import optimizer as dpopt

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=258,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=seq,
        pad_token_id=256,
    )
    base = LlamaForCausalLM(config)
    if checkpointing:
        enable_gradient_checkpointing(base)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    records = [(ids, ids) for ids in (torch.randint(0, 256, (seq,), generator=gen).tolist() for _ in range(batch))]
    data = batching.collate(records, 256)
    if mode == "dp":
        plan = types.SimpleNamespace(
            noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=batch, sample_rate=0.1
        )
        model, dp_opt, _ = dpopt.make_private(model, opt, plan=plan, unit_mean=False, per_sample="fast")

    def step():
        if mode == "dp":
            dp_opt.begin_logical_step(batch)
            dp_opt.prepare_batch(batch)
            batching.per_sequence_loss(model, data).sum().backward()
            dp_opt.accumulate(torch.arange(batch))
            dp_opt.step()
            dp_opt.zero_grad(set_to_none=True)
        else:
            batching.per_sequence_loss(model, data).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    step()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_mib": peak / 2**20, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--child", nargs=3, metavar=("MODE", "CKPT", "SEQ"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        mode, ckpt, seq = args.child
        print(json.dumps(_child(mode, ckpt == "1", int(seq), args.batch, args.layers)))
        return
    root = Path(__file__).resolve().parents[1]
    results = {}
    for seq in args.seq:
        for ckpt in (0, 1):
            for mode in ("nondp", "dp"):
                cmd = [sys.executable, __file__, "--batch", str(args.batch), "--layers", str(args.layers)]
                cmd += ["--child", mode, str(ckpt), str(seq)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=root)
                results[(seq, ckpt, mode)] = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"# {seq} tokens, checkpointing {ckpt}, {mode}: {results[(seq, ckpt, mode)]}", flush=True)
    print(f"Llama stand-in hidden 256, {args.layers} layers, LoRA r=8 q,v, batch {args.batch}, fp32, 1 thread, CPU")
    print(
        f"{'tokens':>6} {'checkpointing':>13} {'non-DP MiB':>10} {'DP-fast MiB':>11} {'DP/non-DP':>9} {'s/step DP':>9}"
    )
    for seq in args.seq:
        for ckpt in (0, 1):
            nd, dp = results[(seq, ckpt, "nondp")], results[(seq, ckpt, "dp")]
            print(
                f"{seq:>6} {'on' if ckpt else 'off':>13} {nd['peak_mib']:>10.0f} {dp['peak_mib']:>11.0f} "
                f"{dp['peak_mib'] / nd['peak_mib']:>9.3f} {dp['seconds']:>9.2f}"
            )
        for mode in ("nondp", "dp"):
            off, on = results[(seq, 0, mode)]["peak_mib"], results[(seq, 1, mode)]["peak_mib"]
            print(f"{seq:>6} checkpointing saves {off - on:.0f} MiB ({on / off:.2f}x peak) for {mode}")


if __name__ == "__main__":
    main()
