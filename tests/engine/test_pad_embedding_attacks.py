"""Attack on padding: a record's overflow must zero that record only, whatever its neighbours' lengths
(dplora.engine.lora.check_pad_embedding refuses a base model whose pad embedding is not finite)."""

from __future__ import annotations

import pytest
import torch


def test_a_neighbours_length_does_not_zero_my_record_through_padding():
    """Guarantee (batch.py): 'the padding width changes nothing'; a record's overflow contributes zero
    for THAT record only. Attack: a public base whose <pad> embedding row is non-finite (an untrained or overflowed
    row; every real token's row is finite). In one physical batch with a longer record j, record i is right-padded:
    attention multiplies the pad keys' NaN values by their zero weights (0·NaN = NaN), so i would be zeroed because
    of j's length (two units move). Fixed: such a base model is refused before any data is read (a fact about the
    public model), so no run ever batches records through a NaN pad embedding."""
    from tiny import byte_tokenizer, tiny_llama

    from dplora.engine.lora import check_pad_embedding as _check_pad_embedding
    from dplora.errors import BadInputError

    model, tok = tiny_llama(), byte_tokenizer()
    _check_pad_embedding(model, tok)  # a finite pad row passes
    with torch.no_grad():
        model.get_input_embeddings().weight[tok.pad_token_id] = float("nan")
    with pytest.raises(BadInputError, match="padding token"):
        _check_pad_embedding(model, tok)
