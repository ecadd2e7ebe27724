"""The served model's context, which alone bounds what `dplora generate` feeds it: the smaller of the config's
positions and the tokenizer's model_max_length, of those defined and sane."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dplora.evaluate.generate import model_context

HUGE = int(1e30)  # transformers' model_max_length when a tokenizer names none


@pytest.mark.parametrize(
    ("positions", "tokenizer_max", "context"),
    [(128, HUGE, 128), (8192, 2048, 2048), (None, 512, 512), (None, HUGE, None), (True, None, None), (0, None, None)],
)
def test_model_context_takes_the_smaller_sane_bound(positions, tokenizer_max, context):
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=positions))
    assert model_context(model, SimpleNamespace(model_max_length=tokenizer_max)) == context


def test_model_context_reads_gpt2_positions_and_a_text_config():
    from transformers import GPT2Config

    gpt2 = SimpleNamespace(config=GPT2Config(n_positions=96))
    assert model_context(gpt2, SimpleNamespace(model_max_length=HUGE)) == 96
    nested = SimpleNamespace(get_text_config=lambda: SimpleNamespace(max_position_embeddings=300))
    assert model_context(SimpleNamespace(config=nested), SimpleNamespace()) == 300
