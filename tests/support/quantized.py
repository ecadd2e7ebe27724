"""Helpers shared by tests/engine/test_quantized.py and its slow tier under tests/slow/."""

from __future__ import annotations

import pytest
import torch
from tiny import byte_tokenizer, tiny_llama  # noqa: E402

bnb = pytest.importorskip("bitsandbytes")  # the `quant` extra; CI installs it (scripts/setup.sh)


OUTLIER, HOT = 99, 3


def build_model_dir(tmp_path_factory):
    """A tiny Llama with the planted outlier feature, saved (unquantized) with its tokenizer."""
    model = tiny_llama(seed=0)
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb[:, HOT] = 0.0
        emb[OUTLIER, HOT] = 1000.0
        model.model.layers[0].input_layernorm.weight[HOT] = 40.0
    folder = tmp_path_factory.mktemp("tiny-4bit-source")
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder
