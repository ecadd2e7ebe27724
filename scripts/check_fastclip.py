"""Device check of the fast per-example path against one-record-at-a-time brute force (CPU or CUDA).

A random-init Llama (SmolLM2-135M's architecture, or ``--layers`` fewer), wide LoRA (r=16 on all 7 projections),
8 right-padded records of 16–96 tokens with masked prompts and one record without a target token, on the device
(TF32 off). Checks, for fp32 and bf16 base weights (LoRA fp32):
  1. each row of FlatLoRAGrads' G against the record's own autograd gradient, trimmed to its real length, on an
     unmodified copy of the peft model: fp32 max |Δ| ≤ 1e-5; bf16 per-record norms within 1 % (relative);
  2. the clipped sum of a unit-level step (units [0,1,2] [3] [4,5,6,7], physical batch 3, so units cross batch
     boundaries) against Σ_u clip_C(Σ_{i∈u} g_i) from the brute-force rows (fp32: max |Δ| ≤ 1e-5).
Prints one line per check and exits 1 if any fails.

    python scripts/check_fastclip.py [--device auto|cpu|cuda] [--layers 30] [--dtypes fp32 bf16] [--toy]
"""

from __future__ import annotations

import argparse
import copy
import sys
import warnings

import torch

from dplora.engine import batch as batching
from dplora.engine.fastclip import FlatLoRAGrads
from dplora.mechanism.clipping import UnitClipAccumulator

ALL_7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GROUPS, PHYSICAL = [[0, 1, 2], [3], [4, 5, 6, 7]], 3


TOY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)


def _model(layers: int, dtype, device, toy: bool = False):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        pad_token_id=0,
    )
    if toy:  # gpu_check.sh --dry-run: the same checks on a toy shape (seconds on CPU)
        for key, value in TOY.items():
            setattr(config, key, value)
        config.head_dim = config.hidden_size // config.num_attention_heads
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.to(dtype)
    peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=ALL_7))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.data = p.data.float()
            if "lora_B" in name:
                p.normal_(0.0, 0.02)  # so lora_A gets gradients too
    peft_model.train()
    return peft_model


def _records(vocab: int = 49152):
    gen = torch.Generator().manual_seed(7)
    records = []
    for i, length in enumerate([16, 40, 96, 23, 64, 31, 50, 77]):
        ids = torch.randint(1, vocab, (length,), generator=gen).tolist()
        prompt = length if i == 3 else 5 * (i % 3)  # record 3: no target token
        records.append((ids, [batching.IGNORE_INDEX] * prompt + ids[prompt:]))
    return records


def _brute_force(model, records, device) -> torch.Tensor:
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for record in records:
        batch = {k: v.to(device) for k, v in batching.collate([record], pad_id=0).items()}
        grads = torch.autograd.grad(batching.per_sequence_loss(model, batch)[0], params, allow_unused=True)
        flat = [(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params, strict=True)]
        rows.append(torch.cat(flat))
    return torch.stack(rows).float()


def _fast(model, flat, records, device) -> torch.Tensor:
    flat.buffer(len(records))
    batch = {k: v.to(device) for k, v in batching.collate(records, pad_id=0).items()}
    batching.per_sequence_loss(model, batch).sum().backward()
    return flat.gradients().clone()


def _unit_step(model, flat, records, device, clip) -> torch.Tensor:
    order = [r for g in GROUPS for r in g]
    unit_of = {r: u for u, g in enumerate(GROUPS) for r in g}
    acc = UnitClipAccumulator(flat.P, clip, device)
    for start in range(0, len(order), PHYSICAL):
        chunk = order[start : start + PHYSICAL]
        ids = torch.tensor([unit_of[r] for r in chunk])
        continues = start + PHYSICAL < len(order) and unit_of[order[start + PHYSICAL]] == int(ids[-1])
        flat.buffer(len(chunk))
        batch = {k: v.to(device) for k, v in batching.collate([records[r] for r in chunk], pad_id=0).items()}
        batching.per_sequence_loss(model, batch).sum().backward()
        acc.add(flat.gradients(), ids, last_unit_continues=continues)
    return acc.finish()[0].clone()


def check(layers: int, dtype_name: str, device: str, toy: bool = False) -> bool:
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    model = _model(layers, dtype, device, toy)
    records = _records(model.config.vocab_size)
    reference = _brute_force(copy.deepcopy(model), records, device)
    flat = FlatLoRAGrads(model)
    G = _fast(model, flat, records, device)
    norms, ref_norms = G.norm(dim=1), reference.norm(dim=1)
    real = ref_norms > 0
    rel_norm = float(((norms[real] - ref_norms[real]).abs() / ref_norms[real]).max())
    rel_l2 = float((G - reference).norm() / reference.norm())
    max_abs = float((G - reference).abs().max())
    units = torch.stack([reference[g].sum(0) for g in GROUPS])
    clip = float(units.norm(dim=1).median())
    expected = sum(u * min(1.0, clip / (float(u.norm()) + 1e-6)) for u in units)
    unit_abs = float((_unit_step(model, flat, records, device, clip) - expected).abs().max())
    ok = (max_abs <= 1e-5 and unit_abs <= 1e-5) if dtype is torch.float32 else rel_norm <= 1e-2
    print(
        f"{'PASS' if ok else 'FAIL'} {device} {dtype_name} layers={layers} P={flat.P:,}: "
        f"per-record max|Δ|={max_abs:.2e}, "
        f"max rel norm Δ={rel_norm:.2e}, rel L2={rel_l2:.2e}, no-target row max|G|={float(G[~real].abs().max()):.1e}; "
        f"unit step max|Δ|={unit_abs:.2e} (C={clip:.3g})",
        flush=True,
    )
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--toy", action="store_true", help="a toy shape (vocab 512, hidden 64): the dry run")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    results = [check(args.layers, d, device, args.toy) for d in args.dtypes]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
