"""The fast per-example path against the one-record-at-a-time reference on six architectures (issue 27).

Tiny random Llama, Qwen2, Mistral, Gemma2, Phi-3 (fused qkv_proj / gate_up_proj) and GPT-2 (Conv1D, peft
``fan_in_fan_out``) built from configs (``tests/tiny.py``), explicit LoRA targets per architecture. The reference:
each record alone, trimmed to its real length, its own autograd gradient through peft's stock forward, flat over
all LoRA tensors in ``named_parameters`` order; units summed, clipped to C and summed by hand. fp32, CPU, no noise.
"""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from tiny import tiny_causal_lm

from dplora.engine import batch as batching
from dplora.engine.fastclip import FlatLoRAGrads
from dplora.mechanism.clipping import UnitClipAccumulator

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")

PAD, IGNORE = 256, batching.IGNORE_INDEX
RECORDS = [
    ([1, 2, 3, 4, 5], [IGNORE, IGNORE, 3, 4, 5]),
    ([6, 7, 8], [6, 7, 8]),
    ([9, 10, 11, 12, 13, 14, 15], [9, 10, 11, 12, 13, 14, 15]),
    ([20, 21], [20, 21]),
    ([30, 31, 32], [IGNORE, IGNORE, IGNORE]),  # no target token: zero gradient
    ([50, 51, 52, 53, 54, 55], [IGNORE, 51, 52, 53, 54, 55]),
]
GROUPS = [[0, 1], [2], [3, 4, 5]]  # unit 2 crosses the physical batch boundary at 4
ARCHS = ["llama", "qwen2", "mistral", "gemma2", "phi3", "gpt2"]


def lora_model(arch: str, *, dropout: float = 0.0, seed: int = 0):
    """A tiny peft LoRA model of ``arch`` in train mode; lora_B ~ N(0, 0.3²) so lora_A gets gradients too."""
    base, targets = tiny_causal_lm(arch, seed=seed)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=targets))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.train()


def brute_force(model, records) -> torch.Tensor:
    """(N, P): each record alone (trimmed), its own autograd gradient, flat over the trainable tensors in order."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for record in records:
        loss = batching.per_sequence_loss(model, batching.collate([record], PAD))[0]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        flat = [(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params, strict=True)]
        rows.append(torch.cat(flat))
    return torch.stack(rows)


def clipped_unit_sum(per_record, groups, c) -> torch.Tensor:
    """Σ_units clip_C(Σ_{records of the unit} g_i), by hand."""
    total = torch.zeros(per_record.shape[1])
    for g in groups:
        v = per_record[g].sum(0)
        total += v * min(1.0, c / (float(v.norm()) + 1e-6))
    return total


def fast_logical_step(model, flat, records, groups, physical, c):
    """Units' records contiguous, cut into physical batches of ``physical``: (G rows stacked, clipped sum)."""
    order = [r for g in groups for r in g]
    unit_of = {r: u for u, g in enumerate(groups) for r in g}
    acc = UnitClipAccumulator(flat.P, c, "cpu")
    acc.begin_step()
    rows = []
    for start in range(0, len(order), physical):
        chunk = order[start : start + physical]
        ids = torch.tensor([unit_of[r] for r in chunk])
        nxt = order[start + physical] if start + physical < len(order) else None
        flat.buffer(len(chunk))
        batching.per_sequence_loss(model, batching.collate([records[r] for r in chunk], PAD)).sum().backward()
        G = flat.gradients()
        rows.append(G.clone())
        acc.add(G, ids, last_unit_continues=nxt is not None and unit_of[nxt] == int(ids[-1]))
    total, _ = acc.finish()
    return torch.cat(rows), total.clone()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a − b| over the largest |b| (relative to the tensor's scale)."""
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("arch", ARCHS)
def test_fast_path_matches_one_record_reference(arch):
    """Rows of G and the per-unit clipped sum (units across physical batches) within 1e-5 relative, fp32."""
    model = lora_model(arch)
    reference = brute_force(copy.deepcopy(model), RECORDS)
    assert float(reference.abs().max()) > 1e-3 and float(reference[4].abs().max()) == 0.0
    flat = FlatLoRAGrads(model)
    layers = sum(1 for m in model.modules() if hasattr(m, "lora_A"))
    assert flat.P == reference.shape[1] and len(flat._slots) == layers >= 2 * len(tiny_causal_lm(arch)[1])
    unit_norms = torch.stack([reference[g].sum(0) for g in GROUPS]).norm(dim=1)
    c = float(unit_norms.median())  # one unit clipped, one not
    rows, total = fast_logical_step(model, flat, RECORDS, GROUPS, 4, c)
    assert rel(rows, reference) < 1e-5
    assert rel(total, clipped_unit_sum(reference, GROUPS, c)) < 1e-5


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_attention_kernels_keep_the_reference(attn):
    """``model.attn_implementation`` sdpa (what auto picks here) and eager: fast rows equal the one-record reference."""
    base, targets = tiny_causal_lm("llama")
    base.set_attn_implementation(attn)
    assert base.config._attn_implementation == attn
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=targets)).train()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    reference = brute_force(copy.deepcopy(model), RECORDS)
    flat = FlatLoRAGrads(model)
    rows, _ = fast_logical_step(model, flat, RECORDS, [[i] for i in range(len(RECORDS))], 4, 1.0)
    assert rel(rows, reference) < 1e-5
