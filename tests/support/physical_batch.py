"""Helpers shared by tests/run/test_physical_batch.py and its slow tier under tests/slow/."""

from __future__ import annotations

import types

import torch
from peft import LoraConfig, get_peft_model
from tiny import tiny_llama

from dplora.engine import batch as batching
from dplora.mechanism import optimizer as dpopt
from support.lora import randomize_lora_b

PAD, IGNORE = 256, batching.IGNORE_INDEX


PLAN = types.SimpleNamespace(
    noise_multiplier=1.0, max_grad_norm=0.5, expected_batch_size=2.0, sample_rate=0.5, steps=3, target_epsilon=10.0
)


PLAN.epsilon_at = lambda step: 0.1 * step


def shared_model():
    """The tiny peft LoRA Llama (r = 4 on q_proj and v_proj, no dropout), lora_B ~ N(0, 0.3²) from seed 1."""
    model = get_peft_model(tiny_llama(seed=0), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    return randomize_lora_b(model, 1)


class OOMAbove:
    """Forward pre-hook: raise torch.OutOfMemoryError when the batch has more than ``k`` records, or on forward
    number ``once_at`` (1-based). Records every batch size it saw."""

    def __init__(self, k: int = 10**9, once_at: int | None = None):
        self.k, self.once_at, self.sizes, self.calls = k, once_at, [], 0

    def __call__(self, module, args, kwargs):
        size = kwargs["input_ids"].shape[0]
        self.calls += 1
        self.sizes.append(size)
        if size > self.k or self.calls == self.once_at:
            raise torch.OutOfMemoryError(f"simulated: {size} records")


def engine(model, monkeypatch, noise, per_sample="fast"):
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.SGD([p for _, p in named], lr=0.5)
    wrapped, dp_opt, accountant = dpopt.make_private(model, opt, plan=PLAN, unit_mean=False, per_sample=per_sample)
    sums = []

    def fixed_noise(clipped_sum, *, noise_multiplier, max_grad_norm, expected_batch_size, generator):
        sums.append(clipped_sum.clone())
        return (clipped_sum + noise).div_(expected_batch_size)

    monkeypatch.setattr(dpopt, "privatize", fixed_noise)
    return wrapped, dp_opt, accountant, named, sums
