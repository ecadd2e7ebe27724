"""Benchmark at the sizes users run: DP-fast against plain peft LoRA on ~1B and ~8B Llama shapes (issue 30).

For one architecture (random init, bf16 base, LoRA r=16 on all 7 projections in fp32), at each sequence length
and for each variant of the base:
  plain  the bf16 base;
  ckpt   with gradient checkpointing (only if ``training.gradient_checkpointing`` is a contract key; else a SKIP
         line: per-example gradients refuse checkpointing until that key exists);
  4bit   the base's linear layers as bitsandbytes NF4 ``Linear4bit`` (double quantization, bf16 compute), as
         ``model.quantization: 4bit`` loads them (this harness quantizes the random-init layers in place);
it measures ``non_dp`` (plain peft LoRA, per-sequence loss, AdamW) and ``dplora_fast`` (the engine's
``privacy.per_sample: fast``: FlatLoRAGrads → clipping → one noise draw → AdamW): median s/step and tokens/s at
the timing batch, peak memory (``torch.cuda.max_memory_allocated``, reset before each measurement; CPU: peak RSS,
not resettable), and the largest physical batch that fits (doubling from the timing batch up to ``--max-batch``,
one step each; an OOM ends the search). The model is built ONCE per variant and mode, directly in bf16 (no fp32
copy: 32 GB for 8B), and reused for every sequence length and batch of that row; the peak is reset after the build
and before each measurement (the fast path's per-example storage freed first), so it is the steps' peak, never
the build's transient (a 4-bit base is quantized from the bf16 build, layer by layer). Steps reuse
scripts/bench.py's batches and step functions. Writes DIR/scale.json (after every row) and DIR/scale.md.

    python scripts/bench_scale.py --arch llama-1b --seqs 512 2048 --out DIR           # GPU
    python scripts/bench_scale.py --arch toy --seqs 32 64 --device cpu --out DIR      # CPU dry run (seconds)
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (scripts/bench.py: ARCHS, _batches, _step_fn)

ARCHS = {
    **bench.ARCHS,
    "llama-8b": dict(  # Llama-3.1-8B shape
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    "toy": dict(  # the dry run's stand-in
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    ),
}
MODES = ("non_dp", "dplora_fast")
VARIANTS = ("plain", "ckpt", "4bit")


def checkpointing_key() -> bool:
    """``training.gradient_checkpointing`` is a contract key (another change adds it)."""
    from dplora.contract.spec import TrainingSection

    return "gradient_checkpointing" in TrainingSection.model_fields


def _quantize_4bit(model, dtype, device):
    """Replace every nn.Linear of the decoder layers by an NF4 ``Linear4bit`` (double quant, compute ``dtype``)."""
    import bitsandbytes as bnb
    import torch

    for layer in model.model.layers:
        for parent in layer.modules():
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear:
                    q = bnb.nn.Linear4bit(
                        child.in_features,
                        child.out_features,
                        bias=False,
                        compute_dtype=dtype,
                        quant_type="nf4",
                        compress_statistics=True,
                    )
                    q.weight = bnb.nn.Params4bit(
                        child.weight.data, requires_grad=False, quant_type="nf4", compress_statistics=True
                    )
                    setattr(parent, name, q.to(device))
                    del child
    return model


def build(arch: str, variant: str, dtype, device):
    """The peft LoRA model (r=16, all 7 projections, fp32 LoRA) on a random-init base of ``arch`` in ``dtype``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**ARCHS[arch], pad_token_id=0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters born in the base's dtype: an fp32 build then cast doubles the build
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    if variant == "4bit":
        model = _quantize_4bit(model, dtype, device)
    if variant == "ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=bench.ALL_7)
    peft_model = get_peft_model(model, lora, autocast_adapter_dtype=True)
    for name, p in peft_model.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()
    peft_model.train()
    return peft_model


def _oom(err: BaseException) -> bool:
    return "out of memory" in str(err).lower() or err.__class__.__name__ == "OutOfMemoryError"


def _free(device) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


class Row:
    """One model and one step function for a (variant, mode), measured at every sequence length and batch."""

    def __init__(self, arch, variant, mode, timing_batch, dtype, device):
        self.arch, self.device = arch, device
        self.model = build(arch, variant, dtype, device)
        self.step = bench._step_fn(mode, self.model, timing_batch, device)

    def measure(self, batch: int, seq: int, steps: int, warmup: int) -> dict:
        """s/step, tokens/s and peak memory of ``steps`` timed steps (after ``warmup``) at ``batch`` × ``seq``; the
        peak counts the model, its optimizer state and the steps, not the build nor an earlier, larger batch."""
        import torch

        self.model.zero_grad(set_to_none=True)
        getattr(self.step, "release", lambda: None)()
        _free(self.device)
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        batches = bench._batches(warmup + steps, batch, seq, ARCHS[self.arch]["vocab_size"], self.device)
        times = []
        try:
            for i, b in enumerate(batches):
                bench._sync(self.device)
                t0 = time.perf_counter()
                self.step(b)
                bench._sync(self.device)
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
            tokens = statistics.mean(float(b["attention_mask"].sum()) for b in batches)
        finally:
            del batches
        peak = torch.cuda.max_memory_allocated() if self.device == "cuda" else bench._rss_now()
        per_step = statistics.median(times)
        return dict(s_per_step=per_step, tokens_per_s=tokens / per_step, peak_mib=peak / 2**20)

    def close(self) -> None:
        del self.step, self.model
        _free(self.device)


def _largest_batch(measure, fits: int, cap: int, device="cpu") -> str:
    """The largest physical batch (doubling from ``fits``, a batch the timed steps just ran, one step each of
    ``measure(batch)``) that fits; ``≥cap`` if all fit. ``fits`` itself is not run again."""
    import torch

    batch = fits * 2
    while batch <= cap:
        try:
            measure(batch)
            fits, batch = batch, batch * 2
        except (RuntimeError, torch.cuda.OutOfMemoryError) as err:
            if not _oom(err):
                raise
            break
        finally:
            _free(device)
    return f"≥{fits}" if fits * 2 > cap else str(fits)


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [
        f"{meta['arch']} on {meta['device_name']}, {meta['dtype']} base, LoRA r=16 on all 7 projections (fp32); "
        f"median of {meta['steps']} steps after {meta['warmup']}; built in bf16 once per variant and mode, "
        "peak memory reset after the build and per measurement",
        "",
        "| seq | variant | mode | batch | s/step | tokens/s | peak MiB | time × non-DP | memory × non-DP "
        "| largest batch |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {(r["seq"], r["variant"]): r for r in rows if r["mode"] == "non_dp" and "s_per_step" in r}
    for r in rows:
        if "s_per_step" not in r:
            lines.append(f"| {r['seq']} | {r['variant']} | {r['mode']} | {r['batch']} | {r['status']} | | | | | |")
            continue
        ref = base.get((r["seq"], r["variant"]))
        tr = f"{r['s_per_step'] / ref['s_per_step']:.3f}" if ref else ""
        mr = f"{r['peak_mib'] / ref['peak_mib']:.3f}" if ref else ""
        lines.append(
            f"| {r['seq']} | {r['variant']} | {r['mode']} | {r['batch']} | {r['s_per_step']:.4f} | "
            f"{r['tokens_per_s']:.0f} | {r['peak_mib']:.0f} | {tr} | {mr} | {r['largest_batch']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=sorted(ARCHS), required=True)
    ap.add_argument("--seqs", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--batch", type=int, default=None, help="timing batch (default: 8 at ≤512 tokens, else 2)")
    ap.add_argument("--max-batch", type=int, default=64, help="the largest-batch search stops here (0: no search)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import warnings

    import torch

    warnings.filterwarnings("ignore")
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    meta = dict(
        arch=args.arch,
        device_name=torch.cuda.get_device_name(0) if device == "cuda" else "CPU",
        dtype="bf16",
        steps=args.steps,
        warmup=args.warmup,
        torch=torch.__version__,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    rows, failed = [], 0

    def save(row: dict) -> None:
        rows.append(row)
        (args.out / "scale.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))

    def fail(row: dict, err: BaseException) -> None:
        nonlocal failed
        failed += 1
        row["status"] = f"failed: {err.__class__.__name__}: {str(err).splitlines()[0][:120]}"
        print(f"FAIL {args.arch} seq {row['seq']} {row['variant']} {row['mode']}: {row['status']}", flush=True)
        save(row)

    def batch_for(seq: int) -> int:
        return args.batch or (8 if seq <= 512 else 2)

    for variant in args.variants:
        if variant == "ckpt" and not checkpointing_key():
            print(f"SKIP {args.arch} ckpt: training.gradient_checkpointing is not a contract key yet")
            for seq in args.seqs:
                for m in args.modes:
                    save(dict(seq=seq, variant=variant, mode=m, batch=batch_for(seq), status="skipped"))
            continue
        for mode in args.modes:
            try:  # one build per variant and mode, in bf16
                harness = Row(args.arch, variant, mode, batch_for(args.seqs[0]), dtype, device)
            except Exception as err:  # noqa: BLE001 - a row that fails is reported, the others still run
                for seq in args.seqs:
                    fail(dict(seq=seq, variant=variant, mode=mode, batch=batch_for(seq)), err)
                _free(device)
                continue
            for seq in args.seqs:
                batch = batch_for(seq)
                row = dict(seq=seq, variant=variant, mode=mode, batch=batch)
                try:
                    row |= harness.measure(batch, seq, args.steps, args.warmup)
                    row["largest_batch"] = (
                        _largest_batch(lambda b, h=harness, s=seq: h.measure(b, s, 1, 0), batch, args.max_batch, device)
                        if args.max_batch
                        else ""
                    )
                except Exception as err:  # noqa: BLE001 - a row that fails is reported, the others still run
                    _free(device)
                    fail(row, err)
                    continue
                print(
                    f"OK {args.arch} seq {seq} {variant} {mode}: {row['s_per_step']:.4f} s/step, "
                    f"{row['tokens_per_s']:.0f} tokens/s, peak {row['peak_mib']:.0f} MiB, "
                    f"largest batch {row['largest_batch']}",
                    flush=True,
                )
                save(row)
            harness.close()
    table = markdown(meta, rows)
    (args.out / "scale.md").write_text(table)
    print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
