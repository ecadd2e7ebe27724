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


# fp32 logits per chunk of the loss: 2**26 elements = 256 MiB. A (B, L, V) batch with B·L·V at most this is one
# chunk, computed exactly as a whole-batch cross entropy (the demo: 8 × 64 tokens × 49,152 = 2.5e7); Llama-3's
# 128,256-token vocabulary at 16 × 2,048 tokens is 4.2e9 elements, 17 GB in fp32, taken in 64 chunks of 32 positions.
LOSS_CHUNK_ELEMENTS = 1 << 26


def per_sequence_loss(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], *, chunk_elements: int | None = None
) -> torch.Tensor:
    """One loss per sequence: the mean token cross entropy over its real target tokens.

    Padding and prompt tokens (label −100) are masked, so the padding width changes nothing (cases T3); a
    sequence with no target token has loss 0 and zero gradient. The model's own ``labels=`` loss is not used:
    it averages over the whole batch and couples the examples' gradients. The cross entropy is taken in fp32
    over chunks of positions (:func:`token_losses`), so the fp32 logits of the whole batch never exist at once.

    Args:
        model: a causal LM whose output has ``.logits`` (B, L, V).
        batch: ``input_ids``, ``attention_mask`` and ``labels``, each (B, L) tokens (:func:`collate`).
        chunk_elements: fp32 logits per chunk (default :data:`LOSS_CHUNK_ELEMENTS`).

    Returns:
        Tensor of shape (B,), nats per token (fp32).
    """
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = batch["labels"][:, 1:]
    tok = token_losses(logits[:, :-1, :], targets, chunk_elements=chunk_elements)
    mask = (targets != IGNORE_INDEX).to(tok.dtype)
    return (tok * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits in any float dtype, (B, T) targets → (B, T) fp32 nats per token (0 where −100)."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).view(targets.shape)


def token_losses(logits: torch.Tensor, targets: torch.Tensor, *, chunk_elements: int | None = None) -> torch.Tensor:
    """Per-token cross entropy in fp32, over chunks of positions of at most ``chunk_elements`` logits each.

    A batch within one chunk is one fp32 cross entropy (as before chunking, bit for bit). A larger one is split
    along the positions; each chunk with a gradient runs under non-reentrant activation checkpointing
    (``torch.utils.checkpoint``), which saves only the chunk's model-dtype logits (a view) and recomputes its
    fp32 log-softmax in the backward, one chunk at a time: the fp32 copy and the log-softmax that
    ``F.cross_entropy`` keeps for its backward never exist for the whole batch. Per token the arithmetic is the
    same (the softmax is over the vocabulary of one position). Source: the chunked cross entropy of torchtune
    (``CEWithChunkedOutputLoss``) and Liger Kernel's fused linear cross entropy, here without fusing the output
    layer.

    Args:
        logits: (B, T, V) model-dtype logits of the predicting positions.
        targets: (B, T) token ids, −100 where ignored.
        chunk_elements: fp32 logits per chunk (default :data:`LOSS_CHUNK_ELEMENTS`); at least one position.

    Returns:
        (B, T) fp32 nats per token.
    Raises:
        ValueError: ``chunk_elements`` < 1.
    """
    limit = LOSS_CHUNK_ELEMENTS if chunk_elements is None else chunk_elements
    if limit < 1:
        raise ValueError(f"chunk_elements={limit}: expected >= 1")
    size, positions, vocab = logits.shape
    per_chunk = max(1, limit // max(1, size * vocab))
    if positions <= per_chunk:
        return _cross_entropy(logits, targets)
    from torch.utils.checkpoint import checkpoint

    pieces = []
    for part, goal in zip(logits.split(per_chunk, dim=1), targets.split(per_chunk, dim=1), strict=True):
        if part.requires_grad and torch.is_grad_enabled():
            pieces.append(checkpoint(_cross_entropy, part, goal, use_reentrant=False, preserve_rng_state=False))
        else:
            pieces.append(_cross_entropy(part, goal))
    return torch.cat(pieces, dim=1)
