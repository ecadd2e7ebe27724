"""Issue 42.8: TRL prompt/completion (text and conversational) and ShareGPT records, detected by ``record_format:
auto`` from the file's structure, read through the chat template; the tokens trained on are exactly the completion's
or the assistant's.

Expected (ids, labels) are built by hand from the ChatML template's literal pieces, tokenized one by one by the
tokenizer saved with :func:`tiny.save_chat_model` — never from the code under test.
"""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import TOKENIZE_PRIVACY, contract_table
from tiny import CHATML, save_chat_model

from dplora.contract.loader import load_contract
from dplora.contract.shape import Structure, detect_shape, read_structure
from dplora.data import tokens as tokenizing
from dplora.data.chat import check_messages, tokenization_entry
from dplora.errors import BadInputError

IGN = -100
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(save_chat_model(tmp_path_factory.mktemp("chat-model"), CHATML))


def _hand(tok, pieces):
    ids, labels = [], []
    for text, target in pieces:
        t = tok(text, add_special_tokens=False)["input_ids"]
        ids += t
        labels += t if target else [IGN] * len(t)
    return ids, labels


def _contract(tmp_path, data_path, **data):
    raw = {
        "privacy": {**TOKENIZE_PRIVACY, "num_units": 2},
        "model": {"path": "unused"},
        "data": {"path": str(data_path), **data},
        "training": {"expected_batch_size": 1, "steps": 1, "max_seq_len": 256},
    }
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_contract(path)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _encode(contract, tok):
    table = contract_table(contract)
    return tokenizing.encode_records(table, tok, contract.data, max_seq_len=contract.training.max_seq_len)[0]


def test_trl_text_prompt_completion_is_detected_and_trains_on_the_completion_only(tmp_path, tok):
    path = _jsonl(
        tmp_path / "pc.jsonl",
        [{"prompt": "Where is order 12?", "completion": "It ships today."}, {"prompt": "Hi", "completion": "Hello!"}],
    )
    contract = _contract(tmp_path, path)
    assert (contract.data.kind, contract.data.prompt_column, contract.data.response_column) == (
        "prompt_response",
        "prompt",
        "completion",
    )
    got = _encode(contract, tok)
    assert got[0] == _hand(
        tok,
        [
            (SYSTEM + "<|im_start|>user\nWhere is order 12?<|im_end|>\n<|im_start|>assistant\n", False),
            ("It ships today.<|im_end|>\n", True),
        ],
    )
    assert tok.decode([i for i, y in zip(*got[1], strict=True) if y != IGN]) == "Hello!<|im_end|>\n"
    csv_path = tmp_path / "pc.csv"  # the same columns in a csv header
    csv_path.write_text("prompt,completion\nWhere is order 12?,It ships today.\n")
    assert _encode(_contract(tmp_path, csv_path), tok)[0] == got[0]


def test_trl_conversational_prompt_completion_trains_on_the_completion_turns_only(tmp_path, tok):
    prompt = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Order 12?"},
        {"role": "assistant", "content": "Which store?"},  # an assistant turn of the prompt: context, not a target
        {"role": "user", "content": "Leeds"},
    ]
    completion = [{"role": "assistant", "content": "Shipped today."}]
    path = _jsonl(tmp_path / "conv.jsonl", [{"prompt": prompt, "completion": completion}])
    contract = _contract(tmp_path, path)
    assert (contract.data.kind, contract.data.messages_key, contract.data.completion_column) == (
        "messages",
        "prompt",
        "completion",
    )
    (got,) = _encode(contract, tok)
    want = _hand(
        tok,
        [
            ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nOrder 12?<|im_end|>\n", False),
            ("<|im_start|>assistant\nWhich store?<|im_end|>\n", False),
            ("<|im_start|>user\nLeeds<|im_end|>\n<|im_start|>assistant\n", False),
            ("Shipped today.<|im_end|>\n", True),
        ],
    )
    assert got == want
    # the same conversation as one `messages` record trains on both assistant turns: the completion rule is real
    both = _contract(tmp_path, _jsonl(tmp_path / "m.jsonl", [{"messages": prompt + completion}]))
    (whole,) = _encode(both, tok)
    assert whole[0] == want[0] and tok.decode([i for i, y in zip(*whole, strict=True) if y != IGN]) == (
        "Which store?<|im_end|>\nShipped today.<|im_end|>\n"
    )
    assert tokenization_entry(tok, contract.data)["train_on"] == "completion (assistant)"


def test_sharegpt_conversations_map_roles_and_train_on_the_gpt_turns(tmp_path, tok):
    turns = [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "Order 12?"},
        {"from": "gpt", "value": "Shipped."},
        {"from": "human", "value": "Thanks"},
        {"from": "gpt", "value": "Welcome!"},
    ]
    path = _jsonl(tmp_path / "sharegpt.jsonl", [{"conversations": turns, "id": "a"}])
    contract = _contract(tmp_path, path)
    assert contract.data.messages_key == "conversations" and contract.data.completion_column is None
    (got,) = _encode(contract, tok)
    assert got == _hand(
        tok,
        [
            ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nOrder 12?<|im_end|>\n", False),
            ("<|im_start|>assistant\n", False),
            ("Shipped.<|im_end|>\n", True),
            ("<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n", False),
            ("Welcome!<|im_end|>\n", True),
        ],
    )
    assert [m["role"] for m in check_messages(turns, 1, "conversations")] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]


def test_parquet_conversational_prompt_completion_is_detected_from_the_schema(tmp_path):
    import datasets

    path = tmp_path / "pc.parquet"
    rows = [{"prompt": [{"role": "user", "content": "a"}], "completion": [{"role": "assistant", "content": "b"}]}]
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    structure = read_structure(path)
    assert structure.columns == {"prompt": "list", "completion": "list"}
    assert structure.turn_keys["prompt"] == ("content", "role") or set(structure.turn_keys["prompt"]) == {
        "role",
        "content",
    }
    assert detect_shape(structure).keys == {"messages_column": "prompt", "completion_column": "completion"}


@pytest.mark.parametrize(
    ("columns", "keys"),
    [
        ({"messages": "list", "prompt": "text", "completion": "text"}, {}),  # messages wins, as before
        ({"conversations": "list"}, {"messages_column": "conversations"}),
        (
            {"prompt": "text", "completion": "text", "id": "other"},
            {"prompt_column": "prompt", "response_column": "completion"},
        ),
        ({"prompt": "list", "completion": "list"}, {"messages_column": "prompt", "completion_column": "completion"}),
    ],
)
def test_detection_table(columns, keys):
    assert detect_shape(Structure("jsonl", columns, {})).keys == keys


def test_detection_reads_only_the_first_record_s_structure(tmp_path):
    """Records after the first never change the shape (their values and count are not read)."""
    first = {"prompt": "p", "completion": "c"}
    a = read_structure(_jsonl(tmp_path / "a.jsonl", [first]))
    b = read_structure(_jsonl(tmp_path / "b.jsonl", [first] + [{"prompt": "x" * 500, "completion": "y"}] * 50))
    assert a == b
    assert detect_shape(Structure("csv", {"prompt": "text"}, {})) is None


def test_auto_resolves_from_the_keys_every_record_has_so_a_neighbour_resolves_the_same(tmp_path):
    """The first record (one unit) also carries a ShareGPT ``conversations`` list the others lack: read from the
    first record alone, ``auto`` resolved D as ShareGPT and D' (that unit removed) as prompt/completion, so the
    signed contract.yaml told them apart. From the keys every record has, both resolve alike; the documented
    residual is a unit that is the only one lacking a key."""
    first = {"prompt": "p0", "completion": "c0", "conversations": [{"from": "human", "value": "hi"}]}
    rest = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(1, 4)]
    d = _contract(tmp_path, _jsonl(tmp_path / "d.jsonl", [first, *rest]))
    d_prime = _contract(tmp_path, _jsonl(tmp_path / "d2.jsonl", rest))
    assert d.data.model_dump(exclude={"path"}) == d_prime.data.model_dump(exclude={"path"})
    assert (d.data.prompt_column, d.data.response_column, d.data.messages_column) == ("prompt", "completion", None)
    lacking = _contract(tmp_path, _jsonl(tmp_path / "r.jsonl", [{"prompt": "p"}, *rest]))  # the residual case
    assert lacking.data.prompt_column is None


def test_named_columns_or_another_record_format_are_never_re_resolved(tmp_path):
    path = _jsonl(tmp_path / "pc.jsonl", [{"prompt": "p", "completion": "c", "t": "x"}])
    assert _contract(tmp_path, path, text_column="t").data.kind == "text"
    assert _contract(tmp_path, path, record_format="messages").data.messages_key == "messages"


@pytest.mark.parametrize(
    ("turn", "needle"),
    [
        ({"speaker": "user", "text": "private words"}, "message 1 has keys 'speaker', 'text'; expected {\"role\""),
        ({"from": "bot", "value": "private words"}, "message 1 (ShareGPT) has a 'from' other than human, gpt, system"),
        ({"from": "human", "value": 3}, "message 1 has non-text value (int)"),
    ],
)
def test_bad_shapes_name_the_expected_keys_never_the_text(turn, needle):
    with pytest.raises(BadInputError) as err:
        check_messages([turn], 2, "conversations")
    assert needle in str(err.value) and "private" not in str(err.value)
    assert 'ShareGPT {"from", "value"}' in str(check_messages_error([{"x": 1}]))


def check_messages_error(value) -> BadInputError:
    try:
        check_messages(value, 1, "messages")
    except BadInputError as err:
        return err
    raise AssertionError("no error")


def test_a_file_with_no_known_shape_names_the_shapes_auto_reads(tmp_path):
    path = _jsonl(tmp_path / "odd.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(BadInputError) as err:
        contract_table(_contract(tmp_path, path))
    msg = str(err.value)
    assert "no column 'messages'; columns are: question, answer" in msg
    assert "ShareGPT 'conversations'" in msg and "TRL 'prompt' + 'completion'" in msg


def test_completion_column_needs_a_conversation_column():
    from pydantic import ValidationError

    from dplora.contract.spec import DataSection

    with pytest.raises(ValidationError, match="data.completion_column"):
        DataSection.model_validate({"path": "x.jsonl", "text_column": "t", "completion_column": "c"})
