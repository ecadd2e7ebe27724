"""Helpers shared by tests/engine/test_checkpointing.py and tests/slow/engine/test_checkpointing.py (its slow tier)."""

from __future__ import annotations

from peft import LoraConfig, get_peft_model
from tiny import tiny_causal_lm

from dplora.engine.model import enable_gradient_checkpointing
from support.lora import randomize_lora_b

PAD = 256


ALL_7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def shared_model(*, checkpointing: bool, dropout: float = 0.3, arch: str = "llama", targets=ALL_7, seed: int = 0):
    base, arch_targets = tiny_causal_lm(arch, seed=seed)
    if checkpointing:
        enable_gradient_checkpointing(base)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=targets or arch_targets)
    model = get_peft_model(base, config)
    return randomize_lora_b(model, seed + 1)
