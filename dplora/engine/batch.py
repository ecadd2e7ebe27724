"""Token batches and the per-sequence loss: what every per-example gradient path (fast, Opacus, the gradient check,
evaluation) feeds the model and differentiates.

Shared by :mod:`dplora.mechanism.optimizer` and :mod:`dplora.engine.gradcheck`, which imports it instead of the step
module (no import cycle).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def collate(
    examples: list[tuple[list[int], list[int]]], pad_id: int, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """Right-pad (input_ids, labels) pairs into tensors of shape (B, L) tokens on ``device``; pad labels are −100.

    Built in numpy and copied to ``device`` once per tensor (one host-to-device copy, no per-row copies).
    """
    import numpy as np

    width = max(len(ids) for ids, _ in examples)
    ids = np.full((len(examples), width), pad_id, dtype=np.int64)
    labels = np.full((len(examples), width), IGNORE_INDEX, dtype=np.int64)
    mask = np.zeros((len(examples), width), dtype=np.int64)
    for i, (x, y) in enumerate(examples):
        ids[i, : len(x)] = x
        labels[i, : len(y)] = y
        mask[i, : len(x)] = 1
    return {
        "input_ids": torch.as_tensor(ids, device=device),
        "attention_mask": torch.as_tensor(mask, device=device),
        "labels": torch.as_tensor(labels, device=device),
    }


def per_sequence_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One loss per sequence: the mean token cross entropy over its real target tokens.

    Padding and prompt tokens (label −100) are masked, so the padding width changes nothing (cases T3); a
    sequence with no target token has loss 0 and zero gradient. The model's own ``labels=`` loss is not used:
    it averages over the whole batch and couples the examples' gradients.

    Returns:
        Tensor of shape (B,), nats per token.
    """
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits, targets = logits[:, :-1, :], batch["labels"][:, 1:]
    tok = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).view(targets.shape)
    mask = (targets != IGNORE_INDEX).to(tok.dtype)
    return (tok * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
