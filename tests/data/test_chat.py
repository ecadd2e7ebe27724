"""Issue 28: conversations through the chat template, assistant-only masks, turn-aware truncation, bad records.

Expected masks are built by hand from the template's literal pieces (tokenized one by one), never from the code
under test.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import contract_table, minimal_contract
from support.chat import CONVO, IGN
from tiny import CHATML, LLAMA3, chat_tokenizer

from dplora.data import tokens as tokenizing
from dplora.data.chat import ChatEncoder, check_messages, template_sha256
from dplora.errors import BadInputError


def _tok(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _hand(tokenizer, pieces: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """(ids, labels) from literal (text, is_target) pieces."""
    ids, labels = [], []
    for text, target in pieces:
        t = _tok(tokenizer, text)
        ids += t
        labels += t if target else [IGN] * len(t)
    return ids, labels


def test_chatml_mask_is_the_assistant_content_and_end_marker():
    tok = chat_tokenizer(CHATML)
    got = ChatEncoder(tok, CHATML, 512).encode(CONVO)
    want = _hand(
        tok,
        [
            ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nOrder 12 is late<|im_end|>\n", False),
            ("<|im_start|>assistant\n", False),
            ("Sorry, resent.<|im_end|>\n", True),
            ("<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n", False),
            ("Welcome!<|im_end|>\n", True),
        ],
    )
    assert got == want
    assert tok.convert_ids_to_tokens([i for i, y in zip(*got, strict=True) if y != IGN]).count("<|im_end|>") == 2


def test_chatml_default_system_turn_is_context():
    tok = chat_tokenizer(CHATML)
    got = ChatEncoder(tok, CHATML, 512).encode(CONVO[1:3])
    system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    want = _hand(
        tok,
        [(system + "<|im_start|>user\nOrder 12 is late<|im_end|>\n<|im_start|>assistant\n", False)]
        + [("Sorry, resent.<|im_end|>\n", True)],
    )
    assert got == want


def test_llama3_mask_matches_a_hand_built_one():
    tok = chat_tokenizer(LLAMA3)
    got = ChatEncoder(tok, LLAMA3, 512).encode(CONVO)
    h = "<|start_header_id|>{}<|end_header_id|>\n\n"
    want = _hand(
        tok,
        [
            ("<|begin_of_text|>" + h.format("system") + "Be brief.<|eot_id|>", False),
            (h.format("user") + "Order 12 is late<|eot_id|>" + h.format("assistant"), False),
            ("Sorry, resent.<|eot_id|>", True),
            (h.format("user") + "Thanks<|eot_id|>" + h.format("assistant"), False),
            ("Welcome!<|eot_id|>", True),
        ],
    )
    assert got == want
    assert got[0][0] == tok.bos_token_id


def test_train_on_all_labels_every_token():
    tok = chat_tokenizer(CHATML)
    ids, labels = ChatEncoder(tok, CHATML, 512, "all").encode(CONVO)
    assert labels == ids == _tok(tok, tok.apply_chat_template(CONVO, tokenize=False))


def test_truncation_keeps_whole_turns_and_cuts_the_reply_that_does_not_fit():
    tok = chat_tokenizer(CHATML)
    first = _tok(tok, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nOrder 12 is late<|im_end|>\n")
    reply = _tok(tok, "<|im_start|>assistant\nSorry, resent.<|im_end|>\n")
    second_user = _tok(tok, "<|im_start|>user\nThanks<|im_end|>\n")
    header = _tok(tok, "<|im_start|>assistant\n")
    # room for the first exchange, the second user turn, the last reply's header and 2 of its tokens
    max_len = len(first) + len(reply) + len(second_user) + len(header) + 2
    enc = ChatEncoder(tok, CHATML, max_len)
    ids, labels = enc.encode(CONVO)
    assert len(ids) == max_len
    whole = first + reply + second_user
    assert ids[: len(whole)] == whole
    assert tok.decode(ids[len(whole) :]) == "<|im_start|>assistant\nWe"
    assert [y for y in labels[len(whole) :] if y != IGN] == _tok(tok, "We")
    assert (enc.stats.truncated, enc.stats.dropped, enc.stats.turns_dropped) == (1, 0, 0)
    # one token less than the second user turn: it and the last reply are dropped whole, the first exchange stays
    enc = ChatEncoder(tok, CHATML, len(first) + len(reply) + len(second_user) - 1)
    ids, labels = enc.encode(CONVO)
    assert ids == first + reply
    assert enc.stats.turns_dropped == 1 and enc.stats.tokens_cut == len(second_user)


def test_a_long_first_prompt_is_cut_so_the_first_reply_keeps_up_to_half():
    tok = chat_tokenizer(CHATML)
    convo = [{"role": "user", "content": "x" * 500}, {"role": "assistant", "content": "ok"}]
    ids, labels = ChatEncoder(tok, CHATML, 160).encode(convo)  # the default system turn takes 83 tokens
    system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    markup = system + "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n"
    kept = 160 - len(_tok(tok, markup.format("")))  # the reply needs 4 < 80 tokens: the prompt takes the rest
    assert ids == _tok(tok, markup.format("x" * kept))
    assert tok.decode([i for i, y in zip(ids, labels, strict=True) if y != IGN]) == "ok<|im_end|>\n"


def test_a_record_with_no_assistant_token_left_is_dropped_not_refused():
    tok = chat_tokenizer(CHATML)
    enc = ChatEncoder(tok, CHATML, 16)  # the default system turn alone exceeds 16 tokens
    ids, labels = enc.encode(CONVO[1:3])
    assert labels == [IGN] and len(ids) == 1
    no_reply = enc.encode([{"role": "user", "content": "hello"}])
    assert no_reply[1] == [IGN]
    assert (enc.stats.records, enc.stats.dropped) == (2, 2)
    # the same record next to a short one: each one's result depends on itself alone
    assert ChatEncoder(tok, CHATML, 16).encode(CONVO[1:3]) == (ids, labels)


def test_a_template_that_rewrites_earlier_turns_is_refused_by_name():
    tok = chat_tokenizer(CHATML)
    rewriting = "{% for m in messages %}{{ m['role'] }}{% if loop.last %}!{% endif %}:{{ m['content'] }}\n{% endfor %}"
    with pytest.raises(BadInputError, match="not prefix-stable") as err:
        ChatEncoder(tok, rewriting, 512).check_template()  # on a synthetic conversation, before any record
    assert "Order 12" not in str(err.value)


def test_a_record_where_the_template_is_not_prefix_stable_is_kept_up_to_that_turn_not_refused():
    """Issue 40 (red team): one record must never decide whether the run releases. A template that is
    prefix-stable on the synthetic conversation but not on one record (its rendering of a later turn rewrites an
    earlier one only for that record's text) keeps that record up to the turn, counts it, and refuses nothing."""
    tok = chat_tokenizer(CHATML)
    # rewrites earlier turns only when the last message holds "REWRITE": prefix-stable on every other conversation
    tricky = (
        "{% set flag = 'REWRITE' in messages[-1]['content'] %}"
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "{% if flag and not loop.last %}*{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    enc = ChatEncoder(tok, tricky, 512)
    enc.check_template()  # stable on the synthetic conversation
    convo = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "REWRITE please"},
        {"role": "assistant", "content": "second answer"},
    ]
    ids, labels = enc.encode(convo)
    first, _ = enc.encode(convo[:2])  # the first exchange alone, through the same template
    assert enc.stats.unstable == 1 and any(y != IGN for y in labels)
    assert ids == first and labels == enc.encode(convo[:2])[1]  # kept up to the unstable turn, nothing after


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("just text", "non-empty list"),
        ([], "non-empty list"),
        ([{"role": "tool", "content": "secret text"}], "message 1 has a role other than system, user, assistant"),
        ([{"role": "user", "content": 7}], "message 1 has non-text content (int)"),
        (["secret text"], "message 1 is not an object"),
    ],
)
def test_bad_conversations_name_row_and_column_never_text(value, needle):
    with pytest.raises(BadInputError, match="column 'messages', data row 4") as err:
        check_messages(value, 4, "messages")
    assert needle in str(err.value) and "secret" not in str(err.value)


def _messages_contract(path, **data):
    base = minimal_contract(max_len=128)
    return base.model_copy(update={"data": base.data.model_validate({"path": str(path), **data})})


def test_a_messages_jsonl_loads_and_a_bad_line_is_refused_with_exit_2(tmp_path):
    path = tmp_path / "chats.jsonl"
    rows = [{"messages": CONVO, "ticket": "a"}, {"messages": CONVO[1:3], "ticket": "b"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = contract_table(_messages_contract(path))
    assert table["messages"][1] == CONVO[1:3]
    bad = [*rows, {"messages": [{"role": "agent", "content": "private words"}], "ticket": "c"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in bad))
    with pytest.raises(BadInputError, match="data row 3: message 1 has a role other than") as err:
        contract_table(_messages_contract(path))
    assert err.value.exit_code == 2 and "private" not in str(err.value)


def test_parquet_conversations_load(tmp_path):
    import datasets

    path = tmp_path / "chats.parquet"
    datasets.Dataset.from_list([{"chat": CONVO}, {"chat": CONVO[1:3]}]).to_parquet(str(path))
    table = contract_table(_messages_contract(path, messages_column="chat"))
    assert table["chat"][0] == CONVO


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"messages_column": "m", "text_column": "t"}, "ambiguous record format"),
        ({"record_format": "text"}, "data.record_format=text needs data.text_column"),
        ({"record_format": "messages", "text_column": "t"}, "needs no text/prompt/response column"),
    ],
)
def test_ambiguous_or_contradicting_record_formats_are_contract_errors(data, needle):
    from pydantic import ValidationError

    from dplora.contract.spec import DataSection

    with pytest.raises(ValidationError, match=needle):
        DataSection.model_validate({"path": "x.jsonl", **data})
    assert DataSection.model_validate({"path": "x.jsonl"}).messages_key == "messages"


def test_one_turn_prompt_response_goes_through_the_template_unless_none():
    import datasets

    tok = chat_tokenizer(CHATML)
    table = datasets.Dataset.from_list([{"message": "Order 12 is late", "reply": "Sorry, resent."}])
    contract = minimal_contract(max_len=128)
    (got,), _ = tokenizing.encode_records(table, tok, contract.data, max_seq_len=contract.training.max_seq_len)
    assert got == ChatEncoder(tok, CHATML, 128).encode(CONVO[1:3])
    assert tok.decode([i for i, y in zip(*got, strict=True) if y != IGN]) == "Sorry, resent.<|im_end|>\n"
    raw = contract.model_copy(update={"data": contract.data.model_copy(update={"chat_template": "none"})})
    ids, _labels = tokenizing.encode_records(table, tok, raw.data, max_seq_len=raw.training.max_seq_len)[0][0]
    assert ids == _tok(tok, "Order 12 is late\nSorry, resent.") + [tok.eos_token_id]
    assert template_sha256(tok, contract.data) == hashlib.sha256(CHATML.encode()).hexdigest()
    assert template_sha256(tok, raw.data) is None
    assert template_sha256(chat_tokenizer(None), contract.data) is None  # no template: the raw format


def test_the_default_system_turn_is_cut_so_a_one_exchange_record_keeps_its_reply(tmp_path):
    """Issue 41.5: ChatML's own system turn (83 tokens) at max_seq_len 96. On main the first prompt was cut to
    nothing and the context still left the reply no room: labels all −100, the record dropped from the loss
    (stats.dropped 1). Now the template's system turn is cut too, at the token level, and the reply keeps
    min(its tokens + 2, 48) tokens: here all of it."""
    from tiny import save_chat_model
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(save_chat_model(tmp_path / "model", CHATML))
    convo = [{"role": "user", "content": "Where is order 12?"}, {"role": "assistant", "content": "It ships today."}]
    enc = ChatEncoder(tok, CHATML, 96)
    ids, labels = enc.encode(convo)
    assert tok.decode([i for i, y in zip(ids, labels, strict=True) if y != IGN]) == "It ships today.<|im_end|>\n"
    assert (enc.stats.truncated, enc.stats.dropped) == (1, 0)
    default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    markup = "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    reply = _tok(tok, "It ships today.<|im_end|>\n")
    allowed = 96 - min(len(_tok(tok, "It ships today.")) + 2, 48)
    kept = allowed - len(_tok(tok, markup.format("", "")))  # the first prompt is cut first, then the system turn
    assert 0 < kept < len(default)
    assert ids == _tok(tok, markup.format(default[:kept], "")) + reply
    assert len(ids) <= 96
    # the cut system turn renders exactly as the template's own one does, content cut: no other change
    assert tok.apply_chat_template(convo, chat_template=CHATML, tokenize=False).startswith(
        markup.format(default, "Where is order 12?").split("<|im_start|>user")[0]
    )


def test_a_template_without_a_default_system_turn_is_unchanged_by_the_system_cut():
    """Llama-3 style (no default system turn): no system turn is found to cut, and a one-exchange record at 96
    keeps its whole reply."""
    tok = chat_tokenizer(LLAMA3)
    convo = [{"role": "user", "content": "Where is order 12?"}, {"role": "assistant", "content": "It ships today."}]
    enc = ChatEncoder(tok, LLAMA3, 96)
    ids, labels = enc.encode(convo)
    assert tok.decode([i for i, y in zip(ids, labels, strict=True) if y != IGN]) == "It ships today.<|eot_id|>"
    assert enc._default_system(convo, 1) is None
