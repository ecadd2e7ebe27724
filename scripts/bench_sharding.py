"""Per-rank memory and time of ``training.sharding: none`` against ``fsdp`` at W ranks (issue 45), on CPU (gloo).

    .venv/bin/python scripts/bench_sharding.py [--hidden 1024 --layers 12] [--ranks 2] [--steps 3] [--out FILE]

Builds a random-init Llama from a config (default hidden 1024, 12 layers, vocab 32,000: about 0.22 B parameters, fp32)
once as a safetensors folder, then for each sharding starts ``torchrun --nproc-per-node W`` on this script's worker:
each rank loads the base the way ``dplora train`` does (:func:`dplora.engine.model.load_base_model` for ``none``,
:func:`dplora.engine.sharding.load_sharded_base` for ``fsdp``), wraps it with LoRA r 8 on q,v (peft), and times
``--steps`` physical steps of the fast per-example path (2 records × 64 tokens per rank: forward, backward, the
(B, P) per-example rows). Reported per rank: base parameters held (local shards) and their bytes, peak RSS after the
load and after the steps (``getrusage`` ru_maxrss, which counts the touched pages of memory-mapped weight files), the
anonymous memory (``RssAnon``: what the process allocated) after the load and its peak during the load and the
steps (sampled every 5 ms), less what it held before loading, and s/step (after one warm-up step). Both shardings run
in one invocation, so their ratio is measured under the same load. The per-unit clipping, noise and optimizer step
are the same code under both shardings and are left out (they touch the LoRA tensors only).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_model(folder: Path, hidden: int, layers: int, vocab: int) -> int:
    """Write a random-init Llama (safetensors, fp32) and a byte tokenizer to ``folder``; returns its parameters."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import byte_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75),
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=256,
        eos_token_id=257,
        bos_token_id=257,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def anon_gib() -> float:
    """This process's anonymous resident memory (``RssAnon`` of /proc/self/status), GiB: what the process
    allocated, without the page cache of memory-mapped weight files (which ``ru_maxrss`` counts once touched)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


class AnonPeak:
    """The peak of :func:`anon_gib`, sampled every 5 ms by a thread (``reset()`` starts a new window)."""

    def __init__(self):
        import threading

        self.peak, self._stop = anon_gib(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, anon_gib())

    def reset(self) -> float:
        seen, self.peak = max(self.peak, anon_gib()), anon_gib()
        return seen

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, anon_gib())


def worker(folder: str, sharding: str, steps: int, out: str) -> None:
    """One rank: load the base under ``sharding``, LoRA, time the steps; write ``out/<sharding>-rank<r>.json``."""
    import torch
    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model

    from dplora.contract.spec import ModelSection
    from dplora.engine import distributed
    from dplora.engine.batch import collate, per_sequence_loss
    from dplora.engine.fastclip import FlatLoRAGrads
    from dplora.engine.model import load_base_model
    from dplora.engine.sharding import load_sharded_base, local_base_parameters

    torch.set_num_threads(1)
    world = distributed.init_world()
    section = ModelSection(path=folder)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    anon0, peak = anon_gib(), AnonPeak()
    t0 = time.perf_counter()
    if sharding == "fsdp":
        base, _ = load_sharded_base(section, torch.device("cpu"), "fp32", False, world, log=lambda *_: None)
    else:
        base, _ = load_base_model(section, torch.device("cpu"), "fp32", False, log=lambda *_: None)
    load_s = time.perf_counter() - t0
    rss_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    anon_load_peak, anon_loaded = peak.reset(), anon_gib()
    torch.manual_seed(0)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    model.train()
    held, total = local_base_parameters(model)
    flat = FlatLoRAGrads(model)
    g = torch.Generator().manual_seed(world.rank)
    examples = [(torch.randint(0, 256, (64,), generator=g).tolist(),) * 2 for _ in range(2)]
    batch = collate(examples, 256)
    times = []
    for _ in range(steps + 1):
        t = time.perf_counter()
        flat.buffer(2)
        per_sequence_loss(model, batch).sum().backward()
        flat.gradients()
        times.append(time.perf_counter() - t)
    rss_step = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    anon_step_peak = peak.stop()
    result = {
        "sharding": sharding,
        "rank": world.rank,
        "world_size": world.world_size,
        "base_parameters_held": held,
        "base_parameters": total,
        "base_gib_held": round(held * 4 / 2**30, 3),
        "anon_before_gib": round(anon0, 3),
        "anon_peak_load_gib": round(anon_load_peak, 3),
        "anon_after_load_gib": round(anon_loaded, 3),
        "anon_peak_steps_gib": round(anon_step_peak, 3),
        "rss_before_gib": round(rss0 / 2**20, 3),
        "peak_rss_after_load_gib": round(rss_load / 2**20, 3),
        "peak_rss_after_steps_gib": round(rss_step / 2**20, 3),
        "load_s": round(load_s, 2),
        "s_per_step": round(sum(times[1:]) / max(len(times) - 1, 1), 3),
    }
    Path(out, f"{sharding}-rank{world.rank}.json").write_text(json.dumps(result))
    if world.distributed:
        dist.barrier()
    distributed.finish(world)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32_000)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, help="write the JSON here too")
    ap.add_argument("--worker", nargs=4, metavar=("FOLDER", "SHARDING", "STEPS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        folder, sharding, steps, out = args.worker
        worker(folder, sharding, int(steps), out)
        return {}
    with tempfile.TemporaryDirectory(prefix="dplora-bench-sharding-") as tmp:
        folder, out = Path(tmp) / "model", Path(tmp) / "out"
        out.mkdir()
        params = build_model(folder, args.hidden, args.layers, args.vocab)
        print(f"model: {params / 1e6:.1f} M parameters (fp32, random init), {args.ranks} ranks, gloo", flush=True)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
        rows = []
        for sharding in ("none", "fsdp"):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks)]
            cmd += [__file__, "--worker", str(folder), sharding, str(args.steps), str(out)]
            subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            rows += [json.loads((out / f"{sharding}-rank{r}.json").read_text()) for r in range(args.ranks)]
    report = {"model_parameters": params, "ranks": args.ranks, "rows": rows}
    for sharding in ("none", "fsdp"):
        mine = [r for r in rows if r["sharding"] == sharding]
        report[sharding] = {
            "base_gib_held_per_rank": max(r["base_gib_held"] for r in mine),
            "anon_after_load_gib_per_rank": max(r["anon_after_load_gib"] - r["anon_before_gib"] for r in mine),
            "anon_peak_load_gib_per_rank": max(r["anon_peak_load_gib"] - r["anon_before_gib"] for r in mine),
            "anon_peak_step_gib_per_rank": max(r["anon_peak_steps_gib"] - r["anon_before_gib"] for r in mine),
            "peak_rss_gib_per_rank": max(r["peak_rss_after_steps_gib"] for r in mine),
            "s_per_step": max(r["s_per_step"] for r in mine),
        }
    keys = (
        "base_gib_held_per_rank",
        "anon_after_load_gib_per_rank",
        "anon_peak_load_gib_per_rank",
        "anon_peak_step_gib_per_rank",
        "peak_rss_gib_per_rank",
        "s_per_step",
    )
    report["fsdp_over_none"] = {k: round(report["fsdp"][k] / max(report["none"][k], 1e-9), 3) for k in keys}
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
