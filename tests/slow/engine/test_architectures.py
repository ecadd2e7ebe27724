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
from support.architectures import RECORDS, brute_force, clipped_unit_sum, fast_logical_step, rel
from support.lora import randomize_lora_b
from tiny import tiny_causal_lm

from dplora.engine.fastclip import FlatLoRAGrads

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")

GROUPS = [[0, 1], [2], [3, 4, 5]]  # unit 2 crosses the physical batch boundary at 4
ARCHS = ["llama", "qwen2", "mistral", "gemma2", "phi3", "gpt2"]


def lora_model(arch: str, *, dropout: float = 0.0, seed: int = 0):
    """A tiny peft LoRA model of ``arch`` in train mode; lora_B ~ N(0, 0.3²) so lora_A gets gradients too."""
    base, targets = tiny_causal_lm(arch, seed=seed)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=targets))
    return randomize_lora_b(model, seed + 1)


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
