"""The slow tier of tests/data/test_cell_bound.py, whose docstring describes the module."""

from __future__ import annotations

from conftest import contract_records
from conftest import minimal_contract as _contract
from datasets import Dataset
from support.cell_bound import MB3, SpyTokenizer
from tiny import byte_tokenizer


def test_a_3mb_cell_is_cut_before_tokenizing():
    """A 3 MB cell: the tokenizer never sees more than max_seq_len × 32 characters; the record has ≤ max_seq_len
    tokens and they are the cell's first bytes."""
    spy = SpyTokenizer(byte_tokenizer())
    table = Dataset.from_dict({"text": ["x" * MB3, "short"]})
    (ids, labels), (ids2, _) = contract_records(table, spy, _contract(max_len=64, text=True))
    assert max(spy.lengths) == 64 * 32 and len(spy.lengths) == 2
    assert len(ids) == 64 and ids == labels and spy.decode(ids) == "x" * 64
    assert spy.decode(ids2[:-1]) == "short" and ids2[-1] == spy.eos_token_id

    spy.lengths.clear()
    table = Dataset.from_dict({"message": ["p" * MB3, "q"], "reply": ["r" * MB3, "s"]})
    (ids, labels), _ = contract_records(table, spy, _contract(max_len=32))
    assert max(spy.lengths) == 32 * 32
    assert len(ids) == len(labels) == 32
    assert spy.decode(ids[:16]) == "p" * 16 and spy.decode(ids[16:]) == "r" * 16 and labels[:16] == [-100] * 16
