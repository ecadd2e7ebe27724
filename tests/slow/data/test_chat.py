"""The slow tier of tests/data/test_chat.py, whose docstring describes the module."""

from __future__ import annotations

import pytest
from support.chat import CONVO, IGN
from tiny import CHATML, chat_tokenizer, tiny_llama

from dplora.data.chat import ChatEncoder


def test_a_conversation_s_loss_and_gradient_do_not_depend_on_its_batch_mates():
    """cases F2: one conversation's per-record loss and gradient are the same alone, next to a short record and
    next to a long one (a batch-wide token mean would scale them by 5/55 or 5/505)."""
    import torch

    from dplora.engine.batch import collate, per_sequence_loss

    tok = chat_tokenizer(CHATML)
    enc = ChatEncoder(tok, CHATML, 256)
    me = enc.encode(CONVO[1:3])
    short = enc.encode([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    long = enc.encode([{"role": "user", "content": "a"}, {"role": "assistant", "content": "z" * 150}])
    model = tiny_llama(vocab_size=264)
    results = []
    for batch in ([me], [me, short], [me, long], [long, me]):
        model.zero_grad()
        losses = per_sequence_loss(model, collate(batch, tok.pad_token_id))
        row = batch.index(me)
        losses[row].backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((losses[row].detach(), grad))
    for loss, grad in results[1:]:
        torch.testing.assert_close(loss, results[0][0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(grad, results[0][1], atol=1e-6, rtol=1e-5)


def test_the_plain_fallback_is_prefix_stable_under_a_bpe_that_merges_the_space():
    """New-user blocker (issue 42): with a model that has no chat template, SmolLM2's BPE tokenizer merged the plain
    template's generation prompt "assistant: " with the reply's first word, so every conversation was refused as
    not prefix-stable. The generation prompt is now "assistant:" and the reply keeps its leading space."""
    from pathlib import Path

    cache = Path.home() / ".cache" / "dplora" / "models" / "smollm2-135m-instruct"
    if not (cache / "tokenizer.json").is_file():
        pytest.skip("needs the packaged SmolLM2 tokenizer (converted on first use of the packaged model)")
    from transformers import AutoTokenizer

    from dplora.data.chat import PLAIN_TEMPLATE

    tok = AutoTokenizer.from_pretrained(str(cache))
    enc = ChatEncoder(tok, PLAIN_TEMPLATE, 512)
    enc.check_template()
    ids, labels = enc.encode(CONVO)
    target = tok.decode([i for i, y in zip(ids, labels, strict=True) if y != IGN])
    replies = [m["content"] for m in CONVO if m["role"] == "assistant"]
    assert enc.stats.unstable == 0 and all(r in target for r in replies)
