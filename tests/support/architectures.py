"""Helpers shared by test_architectures.py and the tests that build on it."""

from __future__ import annotations

import torch

from dplora.engine import batch as batching
from dplora.mechanism.clipping import UnitClipAccumulator

PAD, IGNORE = 256, batching.IGNORE_INDEX


RECORDS = [
    ([1, 2, 3, 4, 5], [IGNORE, IGNORE, 3, 4, 5]),
    ([6, 7, 8], [6, 7, 8]),
    ([9, 10, 11, 12, 13, 14, 15], [9, 10, 11, 12, 13, 14, 15]),
    ([20, 21], [20, 21]),
    ([30, 31, 32], [IGNORE, IGNORE, IGNORE]),  # no target token: zero gradient
    ([50, 51, 52, 53, 54, 55], [IGNORE, 51, 52, 53, 54, 55]),
]


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


def unit_batches(groups, physical):
    """Units' records contiguous, cut into physical batches of ``physical``: per batch (its record indices, their
    unit ids as a tensor, whether its last unit continues in the next batch)."""
    order = [r for g in groups for r in g]
    unit_of = {r: u for u, g in enumerate(groups) for r in g}
    for start in range(0, len(order), physical):
        chunk = order[start : start + physical]
        ids = torch.tensor([unit_of[r] for r in chunk])
        nxt = order[start + physical] if start + physical < len(order) else None
        yield chunk, ids, nxt is not None and unit_of[nxt] == int(ids[-1])


def fast_logical_step(model, flat, records, groups, physical, c):
    """Units' records contiguous, cut into physical batches of ``physical``: (G rows stacked, clipped sum)."""
    acc = UnitClipAccumulator(flat.P, c, "cpu")
    acc.begin_step()
    rows = []
    for chunk, ids, continues in unit_batches(groups, physical):
        flat.buffer(len(chunk))
        batching.per_sequence_loss(model, batching.collate([records[r] for r in chunk], PAD)).sum().backward()
        G = flat.gradients()
        rows.append(G.clone())
        acc.add(G, ids, last_unit_continues=continues)
    total, _ = acc.finish()
    return torch.cat(rows), total.clone()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a − b| over the largest |b| (relative to the tensor's scale)."""
    return float((a - b).abs().max() / b.abs().max())
