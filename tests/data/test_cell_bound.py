"""Bounded text inputs (issue 26.4): a cell is cut to max_seq_len × 32 characters before it is tokenized, so
memory does not grow with a cell's size, and records of normal-length cells are unchanged."""

from __future__ import annotations

from conftest import minimal_contract as _contract
from datasets import Dataset
from support.cell_bound import MB3, SpyTokenizer
from tiny import byte_tokenizer

from dplora.data.cells import CHARS_PER_TOKEN_BOUND, cell_char_bound, tokenize_cells
from dplora.data.tokens import tokenize_records
from dplora.evaluate.generate import prompt_ids, served_prompt_ids


def _uncut_records(table, tok, contract):
    """The records as tokenizing whole cells gives them (the reference: today's rule without the cut)."""
    data, max_len, eos = contract.data, contract.training.max_seq_len, [tok.eos_token_id]

    def enc(texts):
        return tok([str(t) for t in texts], add_special_tokens=False)["input_ids"]

    if data.text_column:
        return [((ids + eos)[:max_len], (ids + eos)[:max_len]) for ids in enc(table[data.text_column])]
    out = []
    for p, r in zip(enc([f"{p}\n" for p in table["message"]]), enc(table["reply"]), strict=True):
        r = r + eos
        p = p[: max_len // 2] if len(p) + len(r) > max_len else p
        out.append(((p + r)[:max_len], ([-100] * len(p) + r)[:max_len]))
    return out


def test_the_bound_is_max_seq_len_times_32():
    assert CHARS_PER_TOKEN_BOUND == 32
    assert cell_char_bound(64) == 2048 and cell_char_bound(8192) == 262_144


def test_normal_cells_keep_their_token_ids():
    """Cells up to and past the bound (but whose first max_seq_len tokens lie inside it): ids as uncut."""
    tok = byte_tokenizer()
    texts = ["abc", "héllo wörld " * 20, "z" * 40, "ü" * 600, "a b " * 300]
    table = Dataset.from_dict({"text": texts})
    contract = _contract(max_len=16, text=True)
    assert tokenize_records(table, tok, contract.data, max_seq_len=contract.training.max_seq_len) == _uncut_records(
        table, tok, contract
    )
    pairs = Dataset.from_dict({"message": texts, "reply": list(reversed(texts))})
    for max_len in (8, 16, 64):
        contract = _contract(max_len=max_len)
        assert tokenize_records(pairs, tok, contract.data, max_seq_len=contract.training.max_seq_len) == _uncut_records(
            pairs, tok, contract
        )


def test_generate_prompts_go_through_the_same_bound():
    """`dplora generate`'s prompt path cuts a 3 MB prompt to the same bound and keeps training's truncation."""
    spy = SpyTokenizer(byte_tokenizer())
    c = _contract(max_len=32)
    ids = prompt_ids(c.data, c.training, spy, "p" * MB3, 8)
    assert spy.lengths == [32 * 32] and spy.decode(ids) == "p" * 16
    spy.lengths.clear()
    c = _contract(max_len=32, text=True)
    assert prompt_ids(c.data, c.training, spy, "t" * MB3, 8) == spy.inner("t" * 32)["input_ids"]
    assert spy.lengths == [32 * 32]


def test_served_prompts_keep_their_last_context_bound():
    """`dplora generate` feeds a prompt as served, not cut to max_seq_len: a 3 MB prompt keeps its last
    context × 32 characters before tokenizing, then its last context − max_new_tokens tokens, said in one line."""
    spy = SpyTokenizer(byte_tokenizer())
    c = _contract(max_len=32)
    said = []
    ids = served_prompt_ids(c.data, spy, "p" * MB3 + "end", 8, context=128, warn=said.append)
    assert spy.lengths == [128 * 32] and spy.decode(ids) == ("p" * 116) + "end\n"
    assert len(said) == 1 and "context of 128 tokens" in said[0] and "ppp" not in said[0]
    assert (
        served_prompt_ids(c.data, spy, "p" * 100, 8, context=128, warn=said.append)
        == spy.inner("p" * 100 + "\n")["input_ids"]
    )
    assert len(said) == 1  # a prompt that fits is fed whole, unannounced


def test_tokenize_cells_of_no_cells():
    assert tokenize_cells(byte_tokenizer(), [], 64) == []
