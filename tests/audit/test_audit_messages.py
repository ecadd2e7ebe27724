"""Audit canaries as conversations (issue 31): on a messages contract the canary is a user turn + the secret in the
assistant turn, trained and scored through the chat template with the mask of training (assistant span only)."""

from __future__ import annotations

import pytest
from conftest import contract_dict
from support.audit_messages import shared_contract
from tiny import CHATML, save_chat_model

from dplora.audit import canaries

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


def test_a_messages_canary_is_a_conversation_with_the_secret_in_the_assistant_turn(tmp_path):
    """Its record renders through the template; the targets are exactly the assistant span (secret included)."""
    import datasets

    from dplora.data.tokens import tokenize_records
    from dplora.engine.model import load_model_and_tokenizer

    _, contract = shared_contract(tmp_path)
    rows = canaries.canary_rows(
        contract.data, contract.privacy.unit_key, "dplora-canary-00000", "K7QX-09AZ-M2LT-4RQ8", copies=2
    )
    assert len(rows) == 2 and all(r["customer"] == "dplora-canary-00000" for r in rows)
    reply = canaries.REPLY.format(secret="K7QX-09AZ-M2LT-4RQ8")
    conversation = [{"role": "user", "content": canaries.PROMPT}, {"role": "assistant", "content": reply}]
    assert rows[0]["messages"] == conversation
    _, tokenizer = load_model_and_tokenizer(contract.model, lambda *_: None)
    (ids, labels), second = tokenize_records(
        datasets.Dataset.from_list(rows), tokenizer, contract.data, max_seq_len=contract.training.max_seq_len
    )
    assert second == (ids, labels)  # both copies are the same record
    full = tokenizer.apply_chat_template(conversation, chat_template=CHATML, tokenize=False)
    assert tokenizer.decode(ids) == full
    targets = tokenizer.decode([t for t in labels if t != -100])
    assert targets == reply + "<|im_end|>\n"  # the assistant span alone: not the prompt, not the turn header


def test_a_pair_canary_under_chat_template_auto_is_scored_on_the_assistant_span(tmp_path):
    """A prompt/response contract on a model with a template renders the canary pair as the same conversation."""
    import datasets

    from dplora.contract.loader import parse_contract
    from dplora.data.tokens import tokenize_records
    from dplora.engine.model import load_model_and_tokenizer

    model = save_chat_model(tmp_path / "model", CHATML)
    raw = contract_dict(model, tmp_path / "t.csv", tmp_path / "o", training={"max_seq_len": 256})
    contract = parse_contract(raw)
    rows = canaries.canary_rows(contract.data, contract.privacy.unit_key, "c0", "K7QX-09AZ-M2LT-4RQ8")
    reply = canaries.REPLY.format(secret="K7QX-09AZ-M2LT-4RQ8")
    assert rows == [{"message": canaries.PROMPT, "reply": reply}]
    _, tokenizer = load_model_and_tokenizer(contract.model, lambda *_: None)
    [(ids, labels)] = tokenize_records(
        datasets.Dataset.from_list(rows), tokenizer, contract.data, max_seq_len=contract.training.max_seq_len
    )
    conversation = [{"role": "user", "content": canaries.PROMPT}, {"role": "assistant", "content": reply}]
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(conversation, chat_template=CHATML, tokenize=False)
    assert tokenizer.decode([t for t in labels if t != -100]) == reply + "<|im_end|>\n"
