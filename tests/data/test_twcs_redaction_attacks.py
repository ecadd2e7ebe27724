"""Attacks on the TWCS readers (dplora.data.twcs): a customer's records must be a function of that customer's own
tweets and public inputs, and no other customer's id may survive the mention rule.

None of them uses real TWCS text: the files are hand-built.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from dplora.data.twcs import load_twcs_conversations, load_twcs_pairs
from dplora.errors import BadInputError

HEADER = ["tweet_id", "author_id", "inbound", "created_at", "text", "response_tweet_id", "in_response_to_tweet_id"]


def _at(second: int) -> str:
    return f"Tue Oct 31 22:10:{second:02d} +0000 2017"


def _twcs(path: Path, rows: list[list[str]]) -> Path:
    """A TWCS csv written by the csv module (every field quoted as needed, as pandas does)."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(HEADER)
        writer.writerows(rows)
    return path


# Customer 111 and the brand's answer: the records that must not depend on anyone else.
CUSTOMER_A = [
    ["1", "111", "True", _at(1), "@Brand my parcel is late", "2", ""],
    ["2", "Brand", "False", _at(2), "@111 sorry, we will look", "", "1"],
]


@pytest.mark.xfail(
    strict=True,
    reason="known limit (docs/sharp_edges.md, TWCS input dplora cannot classify): a tweet whose text holds a line "
    "that looks like a TWCS row is refused for the whole file, since a quote left open there would move other "
    "customers' tweets into it; a one-unit bad-input refusal, exit 2",
)
@pytest.mark.parametrize("load", [load_twcs_conversations, load_twcs_pairs], ids=["conversations", "pairs"])
def test_another_customers_tweet_text_does_not_refuse_my_records(tmp_path, load):
    """Guarantee: a customer's records are a function of that customer's own tweets and public inputs.
    Attack: customer 222 posts a valid two-line tweet whose second line reads like a TWCS row ("5,6,x,True,fine";
    written by csv as a quoted cell, as pandas writes it). With 222 in the file prepare-twcs refuses the whole file
    (exit 2, "data row 3's text holds a line shaped like a TWCS row"); without 222, customer 111's record is written.
    So 111's output (and the exit code of prepare-twcs, and of every run that follows) is decided by 222's text:
    the same class as the "refusal decided by one unit" row of sharp_edges.md. Found: BadInputError with 222."""
    b = [["3", "222", "True", _at(3), "@Brand my order list:\n5,6,x,True,fine", "", ""]]
    without = load(_twcs(tmp_path / "without.csv", CUSTOMER_A))
    assert [r["customer_id"] for r in without] == ["111"]
    try:
        with_b = load(_twcs(tmp_path / "with.csv", CUSTOMER_A + b))
    except BadInputError as err:
        pytest.fail(f"customer 222's tweet text refused the file: {err}")
    assert [r for r in with_b if r["customer_id"] == "111"] == without


@pytest.mark.parametrize(
    "invisible",
    ["\u2066", "\u2069", "\u061c", "\u034f", "\ufe0f", "\U000e0020"],
    ids=["LRI", "PDI", "ALM", "CGJ", "VS16", "TAG-SPACE"],
)
@pytest.mark.parametrize("load", [load_twcs_conversations, load_twcs_pairs], ids=["conversations", "pairs"])
def test_an_invisible_character_after_the_at_does_not_keep_another_customers_id(tmp_path, load, invisible):
    """Guarantee (twcs.py, docs/data_formats.md): texts are normalised 'with invisible format characters removed,
    so no lookalike @ hides an id from MENTION'; every @id of anyone but the unit's customer and the brands becomes
    @customer. Attack: the brand's answer to 111 writes '@<U+2066>222' (a bidi isolate: Cf, invisible; also U+2069,
    U+061C, the combining grapheme joiner U+034F, a variation selector, a tag character). INVISIBLE lists only
    U+00AD, U+180E, U+200B-U+200F, U+202A-U+202E, U+2060-U+2064, U+FEFF, and none of these is a word character, so
    MENTION does not match and customer 222's id stays, rendered '@222', in customer 111's record. Found: kept."""
    rows = [CUSTOMER_A[0], ["2", "Brand", "False", _at(2), f"@111 we also helped @{invisible}222 today", "", "1"]]
    out = load(_twcs(tmp_path / "t.csv", rows))
    text = out[0]["messages"][1]["content"] if "messages" in out[0] else out[0]["reply"]
    assert "222" not in text, repr(text)
