"""Benchmark: a DP-LoRA step against plain peft LoRA on the same batches; time, tokens/s, peak memory.

Modes (each in its own subprocess, so peak memory is per mode; the order rotates over repeats):
  non_dp, non_dp_2  plain peft LoRA, per-sequence loss, AdamW (run twice: the second shows the noise floor)
  dplora_fast       the engine with privacy.per_sample: fast (dpopt.make_private → UnitDPOptimizer): FlatLoRAGrads
                    → UnitClipAccumulator → one noise draw → .grad views → AdamW
  dplora_opacus     the engine with per_sample: opacus: Opacus hooks → opacus_flat → the same clipping and noise
  opacus            plain Opacus: GradSampleModule hooks + DPOptimizer (flat clipping, noise) → AdamW
Settings: small = LoRA r=8 on q_proj, v_proj, batch 16, seq 128; wide = r=16 on all 7 projections, batch 32,
seq 256; on a GPU also llama-1b = a Llama-3.2-1B shape with wide LoRA, batch 8, seq 256. Models are random-init
from a config (SmolLM2-135M's architecture; ``--quick`` on CPU: a 2-layer stand-in, batch 8, seq 64/128). fp32 on
CPU; fp32 and bf16 base weights (LoRA fp32) on GPU (TF32 off). One logical step = one physical batch; right-padded
batches with masked prompts; σ = 1, C = 1. Each process reports the median s/step over ``--steps`` steps after
``--warmup`` steps, and its peak memory (CPU: peak RSS of the process; GPU: torch.cuda.max_memory_allocated).
Across repeats the table shows medians; ratios are against the median of all non-DP runs of the same setting.
Also times ``dplora budget`` (whole process, cold calibration cache) per accountant.

    python scripts/bench.py --out bench-out --quick          # CPU, a few minutes
    python scripts/bench.py --out bench-out                  # GPU if there is one (about 3 minutes), else CPU

On a GPU one process per (repeat, mode) runs every setting and dtype (peak memory reset per job); on CPU one
process per (repeat, setting, dtype, mode), since peak RSS cannot be reset. DIR/bench.json is rewritten after
every process, so a run cut short keeps what it measured.

Writes DIR/bench.json and DIR/bench.md (also printed). Timings belong here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ALL_7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ARCHS = {  # LlamaConfig keyword arguments
    "smollm2-135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "quick-stand-in": dict(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
    "llama-1b": dict(  # Llama-3.2-1B shape
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}
MODES = ["non_dp", "dplora_fast", "dplora_opacus", "opacus", "non_dp_2"]


def settings(device: str, quick: bool) -> list[dict]:
    """The (name, arch, LoRA, batch, seq) settings for this device."""
    arch = "quick-stand-in" if quick and device == "cpu" else "smollm2-135m"
    small_shape, wide_shape = ((8, 128), (16, 128)) if quick and device == "cpu" else ((16, 128), (32, 256))
    out = [
        dict(name="small", arch=arch, r=8, targets=["q_proj", "v_proj"], batch=small_shape[0], seq=small_shape[1]),
        dict(name="wide", arch=arch, r=16, targets=ALL_7, batch=wide_shape[0], seq=wide_shape[1]),
    ]
    if device == "cuda" and not quick:
        out.append(dict(name="llama-1b", arch="llama-1b", r=16, targets=ALL_7, batch=8, seq=256))
    return out


# ------------------------------------------------------------------------------------------------------ worker


def _batches(n: int, batch: int, seq: int, vocab: int, device):
    """n right-padded batches: lengths in [seq/2, seq], the first 8 tokens a masked prompt (same for every mode)."""
    import torch

    from dplora.engine import batch as batching

    gen = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(n):
        lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=gen).tolist()
        lengths[0] = seq
        records = []
        for length in lengths:
            ids = torch.randint(0, vocab, (length,), generator=gen).tolist()
            records.append((ids, [batching.IGNORE_INDEX] * 8 + ids[8:]))
        out.append({k: v.to(device) for k, v in batching.collate(records, pad_id=0).items()})
    return out


def _model(setting: dict, dtype, device):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**ARCHS[setting["arch"]], pad_token_id=0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.to(dtype)
    lora = LoraConfig(r=setting["r"], lora_alpha=2 * setting["r"], lora_dropout=0.0, target_modules=setting["targets"])
    peft_model = get_peft_model(model, lora)
    for name, p in peft_model.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()  # LoRA fp32 whatever the base dtype
    peft_model.train()
    return peft_model


def _step_fn(mode: str, model, batch_size: int, device):
    """A function(batch) running one full logical step of this mode."""
    import torch

    from dplora.engine import batch as batching
    from dplora.mechanism import optimizer as dpopt

    sigma, clip = 1.0, 1.0
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    if mode.startswith("non_dp"):

        def step(batch):
            batching.per_sequence_loss(model, batch).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step
    if mode == "opacus":
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum")
        dp_opt = DPOptimizer(
            optimizer,
            noise_multiplier=sigma,
            max_grad_norm=clip,
            expected_batch_size=batch_size,
            loss_reduction="sum",
            generator=None,  # Opacus's own baseline: torch's default generator (no release is made here)
        )

        def step(batch):
            batching.per_sequence_loss(gsm, batch).sum().backward()
            dp_opt.step()
            dp_opt.zero_grad(set_to_none=True)

        return step

    from types import SimpleNamespace

    plan = SimpleNamespace(noise_multiplier=sigma, max_grad_norm=clip, expected_batch_size=batch_size, sample_rate=0.01)
    per_sample = {"dplora_fast": "fast", "dplora_opacus": "opacus"}[mode]
    forward, dp_opt, _ = dpopt.make_private(model, optimizer, plan=plan, unit_mean=False, per_sample=per_sample)

    def step(batch):
        rows = batch["input_ids"].shape[0]
        dp_opt.begin_logical_step()
        dp_opt.prepare_batch(rows)
        batching.per_sequence_loss(forward, batch).sum().backward()
        dp_opt.accumulate(torch.arange(rows))  # row level: every record its own unit
        dp_opt.step()
        dp_opt.zero_grad(set_to_none=True)

    # the fast path's (B, P) storage only grows: a harness that reuses this step at several batch sizes frees it
    step.release = dp_opt.flat.release if dp_opt.flat is not None else (lambda: None)
    return step


def _rss_now() -> int:
    """Resident set size of this process now, bytes (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def run_job(mode: str, setting: dict, dtype_name: str, device: str, steps: int, warmup: int) -> dict:
    """One mode on one setting in this process: median s/step, tokens/s, peak memory (bytes)."""
    import gc

    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
    else:
        start = _rss_now()
    model = _model(setting, dtype, device)
    batches = _batches(warmup + steps, setting["batch"], setting["seq"], ARCHS[setting["arch"]]["vocab_size"], device)
    step = _step_fn(mode, model, setting["batch"], device)
    times, cpu_times = [], []
    for i, batch in enumerate(batches):
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        step(batch)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
    tokens = statistics.mean(float(b["attention_mask"].sum()) for b in batches)
    per_step = statistics.median(times)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    result = dict(
        mode=mode,
        setting=setting["name"],
        dtype=dtype_name,
        s_per_step=per_step,
        step_times=times,
        cpu_s_per_step=statistics.median(cpu_times),
        tokens_per_s=tokens / per_step,
        peak_bytes=int(peak),
        peak_above_start_bytes=int(peak - start),
        lora_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        lora_tensors=sum(1 for p in model.parameters() if p.requires_grad),
    )
    del step, model, batches
    gc.collect()
    return result


def worker(spec: dict) -> None:
    """Run the jobs of one subprocess and print one JSON line per job."""
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(spec["threads"])
    if spec["device"] == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    for job in spec["jobs"]:
        result = run_job(spec["mode"], job["setting"], job["dtype"], spec["device"], spec["steps"], spec["warmup"])
        print("RESULT " + json.dumps(result), flush=True)


# ------------------------------------------------------------------------------------------------------ parent


def _spawn(spec: dict, log) -> list[dict]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True, env=env, check=False
    )
    results = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        log(f"  {spec['mode']}: worker failed ({tail})")
    return results


def budget_times(accountants: list[str]) -> list[dict]:
    """Wall and CPU time of one ``dplora budget`` process per accountant, cold calibration cache."""
    contract = (
        "privacy: {protected_unit: row, adjacency: add_remove, target_epsilon: 3, delta: 1.0e-5, accountant: rdp,\n"
        "          max_grad_norm: 1.0, num_units: 10000}\n"
        "model: {path: /nonexistent}\n"
        "data: {path: DATA, prompt_column: message, response_column: reply}\n"
        "training: {expected_batch_size: 100, steps: 1000}\n"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="dplora-bench-") as tmp:
        data = Path(tmp) / "data.csv"  # budget loads no model; with num_units declared the data is only checked
        data.write_text("message,reply\n" + "".join(f"question {i},answer {i}\n" for i in range(20)))
        path = Path(tmp) / "contract.yaml"
        path.write_text(contract.replace("DATA", str(data)))
        for accountant in accountants:
            env = dict(os.environ, DPLORA_CACHE_DIR=str(Path(tmp) / f"cache-{accountant}"))
            env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "from dplora.cli.app import main; main()",
                    "budget",
                    str(path),
                    "--json",
                    "--show-private",  # the planning time is a private diagnostic (it includes the data read)
                    f"privacy.accountant={accountant}",
                ],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            row = dict(
                accountant=accountant,
                wall_s=wall,
                cpu_s=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            )
            if proc.returncode == 0:
                report = json.loads(proc.stdout)
                row.update(
                    sigma=report.get("noise_multiplier"), epsilon=report.get("epsilon"), plan_s=report.get("seconds")
                )
            else:
                row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
            rows.append(row)
    return rows


def summarize(results: list[dict]) -> list[dict]:
    """One row per (setting, dtype, mode): medians over repeats and ratios against all non-DP runs."""
    rows = []
    keys = sorted({(r["setting"], r["dtype"]) for r in results}, key=lambda k: (k[0] != "small", k[0], k[1]))
    for setting, dtype in keys:
        same = [r for r in results if r["setting"] == setting and r["dtype"] == dtype]
        base = [r for r in same if r["mode"].startswith("non_dp")]
        if not base:
            continue
        base_t = statistics.median(r["s_per_step"] for r in base)
        base_c = statistics.median(r["cpu_s_per_step"] for r in base)
        base_m = statistics.median(r["peak_bytes"] for r in base)
        base_d = statistics.median(r["peak_above_start_bytes"] for r in base)
        for mode in MODES:
            runs = [r for r in same if r["mode"] == mode]
            if not runs:
                continue
            t = statistics.median(r["s_per_step"] for r in runs)
            m = statistics.median(r["peak_bytes"] for r in runs)
            c = statistics.median(r["cpu_s_per_step"] for r in runs)
            d = statistics.median(r["peak_above_start_bytes"] for r in runs)
            rows.append(
                dict(
                    setting=setting,
                    dtype=dtype,
                    mode=mode,
                    runs=len(runs),
                    s_per_step=t,
                    tokens_per_s=statistics.median(r["tokens_per_s"] for r in runs),
                    peak_mib=m / 2**20,
                    time_ratio=t / base_t,
                    mem_ratio=m / base_m,
                    cpu_s_per_step=c,
                    cpu_ratio=c / base_c,
                    peak_above_start_mib=d / 2**20,
                    mem_above_start_ratio=d / base_d,
                    lora_params=runs[0]["lora_params"],
                    lora_tensors=runs[0]["lora_tensors"],
                )
            )
    return rows


def markdown(meta: dict, rows: list[dict], budget: list[dict]) -> str:
    lines = [
        f"device: {meta['device_name']}; threads: {meta['threads']}; torch {meta['torch']}; "
        f"{meta['repeats']} repeats × (warm-up {meta['warmup']} + {meta['steps']} steps); quick: {meta['quick']}",
        "",
        "| setting | dtype | mode | s/step | tokens/s | time × non-DP | CPU-time × non-DP | peak MiB | memory × non-DP "
        "| peak − start MiB | (peak − start) × non-DP |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} ({r['lora_tensors']} LoRA tensors, {r['lora_params']:,} params) | {r['dtype']} | "
            f"{r['mode']} | {r['s_per_step']:.4f} | {r['tokens_per_s']:.0f} | **{r['time_ratio']:.3f}** | "
            f"{r['cpu_ratio']:.3f} | {r['peak_mib']:.0f} | **{r['mem_ratio']:.3f}** | "
            f"{r['peak_above_start_mib']:.0f} | {r['mem_above_start_ratio']:.3f} |"
        )
    lines += [
        "",
        f"Memory: {meta['memory']}; 'start' is the same measure just before the model is built. "
        "Ratios: against the median of all non-DP runs (non_dp and non_dp_2) of the same setting and dtype.",
    ]
    if budget:
        lines += ["", "`dplora budget` (q=0.01, T=1000, ε=3, δ=1e-5; cold cache), one process each:", ""]
        lines += ["| accountant | wall s | CPU s | planning s | σ | ε |", "|---|---|---|---|---|---|"]
        for b in budget:
            if "error" in b:
                lines.append(f"| {b['accountant']} | {b['wall_s']:.2f} | {b['cpu_s']:.2f} | failed: {b['error']} | | |")
            else:
                lines.append(
                    f"| {b['accountant']} | {b['wall_s']:.2f} | {b['cpu_s']:.2f} | {b['plan_s']} | "
                    f"{b['sigma']:.4f} | {b['epsilon']:.4f} |"
                )
    return "\n".join(lines) + "\n"


def _write(out: Path, meta: dict, results: list[dict], budget: list[dict]) -> list[dict]:
    rows = summarize(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(dict(meta=meta, summary=rows, runs=results, budget=budget), indent=2))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="folder for bench.json and bench.md")
    ap.add_argument("--quick", action="store_true", help="CPU: a 2-layer stand-in, shorter batches; GPU: no llama-1b")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--repeats", type=int, default=2, help="rounds over all modes (order rotated each round)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per process (median reported)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default: 1 CPU, 2 GPU)")
    ap.add_argument("--settings", nargs="+", default=None, help="subset of: small wide llama-1b")
    ap.add_argument("--dtypes", nargs="+", default=None, help="fp32 bf16 (default: fp32 on CPU, both on GPU)")
    ap.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for every worker (default: free cores)")
    ap.add_argument("--accountants", nargs="*", default=["rdp", "prv", "pld"], help="for dplora budget; none: skip")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    if args.out is None:
        ap.error("--out DIR is required")

    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        from dplora.engine.runtime import free_threads

        threads = args.threads or free_threads()
    else:
        threads = args.threads or min(8, os.cpu_count() or 1)
    steps = args.steps
    warmup = args.warmup if args.warmup is not None else (2 if device == "cuda" else 1)
    dtypes = args.dtypes or (["fp32", "bf16"] if device == "cuda" else ["fp32"])
    chosen = [s for s in settings(device, args.quick) if args.settings is None or s["name"] in args.settings]
    jobs = [dict(setting=s, dtype=d) for s in chosen for d in dtypes]
    meta = dict(
        device=device,
        device_name=torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({os.cpu_count()} cores)",
        threads=threads,
        torch=torch.__version__,
        repeats=args.repeats,
        steps=steps,
        warmup=warmup,
        quick=args.quick,
        settings=chosen,
        memory="torch.cuda.max_memory_allocated" if device == "cuda" else "peak RSS of the worker process",
    )
    print(f"bench on {meta['device_name']}, {threads} threads, {len(jobs)} jobs × {len(args.modes)} modes", flush=True)
    t_start = time.perf_counter()
    results = []
    for rep in range(args.repeats):
        order = args.modes[rep % len(args.modes) :] + args.modes[: rep % len(args.modes)]
        if rep % 2:
            order = order[::-1]
        # GPU: one process per mode runs every job (peak memory reset per job); CPU: one process per job (RSS).
        groups = [jobs] if device == "cuda" else [[j] for j in jobs]
        for group in groups:
            for mode in order:
                spec = dict(mode=mode, jobs=group, device=device, threads=threads, steps=steps, warmup=warmup)
                got = _spawn(spec, print)
                for r in got:
                    print(
                        f"  repeat {rep + 1} {r['setting']:>8} {r['dtype']} {mode:>10}: {r['s_per_step']:.4f} s/step, "
                        f"peak {r['peak_bytes'] / 2**20:.0f} MiB",
                        flush=True,
                    )
                results += [dict(r, repeat=rep) for r in got]
                _write(args.out, meta, results, [])
                (args.out / "bench.md").write_text(markdown(meta, summarize(results), []))
    meta["bench_seconds"] = time.perf_counter() - t_start
    budget = budget_times(args.accountants) if args.accountants else []
    rows = _write(args.out, meta, results, budget)
    table = markdown(meta, rows, budget)
    (args.out / "bench.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
