"""Tiny peft LoRA models and records shared by the engine and mechanism tests (tests/engine/test_engine.py,
test_fastclip.py, test_quantized.py, test_device.py, tests/mechanism/test_mechanism_wrap_attacks.py,
test_optimizer.py, the checkpointing, architectures and physical-batch helpers, and tests/dist_worker.py)."""

from __future__ import annotations

import torch

from dplora.engine import batch as batching

PAD, IGNORE = 256, batching.IGNORE_INDEX  # tests/tiny.py: <pad> = 256, <eos> = 257


ALL_7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# (input_ids, labels) records of different lengths (right padding); records 0, 5 and 8 mask a prompt.
RECORDS = [
    ([1, 2, 3, 4, 5], [IGNORE, IGNORE, 3, 4, 5]),
    ([6, 7, 8], [6, 7, 8]),
    ([9, 10, 11, 12, 13, 14, 15], [9, 10, 11, 12, 13, 14, 15]),
    ([20, 21], [20, 21]),
    ([40, 41, 42, 43], [40, 41, 42, 43]),
    ([50, 51, 52, 53, 54, 55], [IGNORE, 51, 52, 53, 54, 55]),
    ([60, 61, 62], [60, 61, 62]),
    ([70, 71, 72, 73, 74], [70, 71, 72, 73, 74]),
    ([80, 81, 82, 83], [IGNORE, IGNORE, 82, 83]),
]


ALL_PROMPT = ([30, 31, 32], [IGNORE, IGNORE, IGNORE])  # no target token: a zero gradient


def randomize_lora_b(model, seed: int, std: float = 0.3):
    """Every ``lora_B`` tensor (in ``named_parameters`` order) drawn from N(0, std²) by
    ``torch.Generator().manual_seed(seed)``, so that lora_A gets gradients too; returns the model in train mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model.train()


class ReplayDropout(torch.nn.Module):
    """x · masks[example, :T]: replays, one record at a time, the dropout mask a batched forward drew."""

    def __init__(self, masks: torch.Tensor):
        super().__init__()
        self.masks, self.example = masks, 0

    def forward(self, x):
        return x * self.masks[self.example : self.example + 1, : x.shape[1]]
