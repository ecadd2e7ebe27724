"""The per-sequence loss in chunks of positions: the fp32 logits of the whole batch never exist at once.

On a 128k-vocabulary model the loss, not the model, set the largest batch: the logits were copied to fp32 whole
and the cross entropy kept the whole fp32 log-softmax for its backward (about 34 GB at 16 × 2,048 tokens). Chunked,
each chunk's fp32 arithmetic is recomputed in the backward; the losses and every gradient stay those of the whole
batch.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model
from tiny import tiny_llama

from dplora.engine import batch as batching
from dplora.engine import gradcheck
from dplora.mechanism import optimizer as dpopt

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")

IGNORE = batching.IGNORE_INDEX
RECORDS = [
    ([1, 2, 3, 4, 5, 6, 7, 8, 9], [IGNORE, IGNORE, 3, 4, 5, 6, 7, 8, 9]),
    ([10, 11, 12], [10, 11, 12]),
    ([20, 21, 22, 23, 24, 25, 26], [20, 21, 22, 23, 24, 25, 26]),
    ([30, 30, 30, 30], [IGNORE, IGNORE, IGNORE, IGNORE]),  # no target token: loss 0, gradient 0
]
VOCAB = 258


def _lora(dtype=torch.float32):
    model = get_peft_model(
        tiny_llama(seed=0).to(dtype),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
        autocast_adapter_dtype=True,
    )
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.data = p.data.float()
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.train()


def _chunks(monkeypatch) -> list[tuple[int, ...]]:
    """The (B, T, V) shape of every cross entropy the loss computes (forward and recomputation)."""
    shapes = []
    original = batching._cross_entropy

    def spy(logits, targets):
        shapes.append(tuple(logits.shape))
        return original(logits, targets)

    monkeypatch.setattr(batching, "_cross_entropy", spy)
    return shapes


def _loss_and_grads(model, batch, **kw):
    for p in model.parameters():
        p.grad = None
    losses = batching.per_sequence_loss(model, batch, **kw)
    losses.sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return losses.detach(), grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_loss_equals_the_whole_loss(dtype, monkeypatch):
    """Chunks of 2 positions (8 positions: 4 chunks): every sequence's loss within 1e-6 of the whole batch's, every
    LoRA gradient within 1e-6 of its scale; each chunk holds at most ``chunk_elements`` logits and the whole
    batch's B × T × V logits never go through one cross entropy."""
    model = _lora(dtype)
    batch = batching.collate(RECORDS, pad_id=256)
    size, width = batch["input_ids"].shape
    assert (size, width) == (4, 9)
    whole, whole_grads = _loss_and_grads(model, batch)
    shapes = _chunks(monkeypatch)
    limit = 2 * size * VOCAB
    chunked, chunked_grads = _loss_and_grads(model, batch, chunk_elements=limit)
    # forward: 4 chunks of 2, 2, 2, 2 positions; backward: each recomputed once
    assert shapes == [(size, 2, VOCAB)] * 8
    assert max(s[0] * s[1] * s[2] for s in shapes) <= limit < size * (width - 1) * VOCAB
    assert whole.dtype == chunked.dtype == torch.float32 and chunked.shape == (4,)
    assert float(whole[3]) == 0.0 and float(chunked[3]) == 0.0
    assert float((chunked - whole).abs().max()) <= 1e-6, (chunked, whole)
    assert 2.0 < float(whole[:3].min())  # real losses (ln 258 = 5.55 for uniform logits), not zeros
    for name, g in whole_grads.items():
        scale = max(float(g.abs().max()), 1e-12)
        assert float((chunked_grads[name] - g).abs().max()) <= 1e-6 * max(1.0, scale), name
    assert any(float(g.abs().max()) > 1e-4 for g in whole_grads.values())


def test_one_chunk_is_the_whole_batch_bit_for_bit(monkeypatch):
    """A batch within the default chunk (every CPU run of the demo) takes one cross entropy, as before chunking:
    the losses are bitwise those of the explicit single-chunk call."""
    model = _lora()
    batch = batching.collate(RECORDS, pad_id=256)
    shapes = _chunks(monkeypatch)
    default = batching.per_sequence_loss(model, batch)
    assert shapes == [(4, 8, VOCAB)]
    assert batching.LOSS_CHUNK_ELEMENTS == 2**26 >= 4 * 8 * VOCAB
    one = batching.per_sequence_loss(model, batch, chunk_elements=4 * 8 * VOCAB)
    assert torch.equal(default, one)


def test_chunked_loss_without_gradients_is_plain(monkeypatch):
    """Under ``torch.no_grad`` (evaluation) the chunks are computed once each, with no recomputation."""
    model = _lora()
    batch = batching.collate(RECORDS, pad_id=256)
    whole = batching.per_sequence_loss(model, batch).detach()
    shapes = _chunks(monkeypatch)
    with torch.no_grad():
        chunked = batching.per_sequence_loss(model, batch, chunk_elements=3 * 4 * VOCAB)
    assert shapes == [(4, 3, VOCAB), (4, 3, VOCAB), (4, 2, VOCAB)]
    assert float((chunked - whole).abs().max()) <= 1e-6


def test_chunk_elements_below_one_is_refused():
    with pytest.raises(ValueError, match="chunk_elements=0"):
        batching.token_losses(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), chunk_elements=0)


@pytest.mark.parametrize("per_sample", ["fast", "opacus"])
def test_per_example_rows_with_a_chunked_loss_match_one_record_backwards(per_sample):
    """The per-example check (batched rows against one-record backwards) passes with one position per chunk: the
    recomputation inside the backward keeps each record's own gradient, on the fast path and under Opacus."""
    model = _lora()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([p for _, p in named], lr=0.1)
    plan = SimpleNamespace(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4, sample_rate=0.1)
    wrapped, dp_opt, _ = dpopt.make_private(model, optimizer, plan=plan, unit_mean=False, per_sample=per_sample)
    loss = functools.partial(batching.per_sequence_loss, chunk_elements=1)  # one position per chunk
    report = gradcheck.check_per_example_gradients(wrapped, named, dp_opt, loss=loss)
    assert [(r["records"], r["padded_tokens"]) for r in report] == [(3, 5), (3, 3), (3, 4)]
    assert max(r["max_relative_difference"] for r in report) <= 1e-4, report
