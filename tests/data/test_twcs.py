"""Tests for dplora.data.twcs on the shared TWCS 5,000-row sample (skipped when the file is absent).

Assertions report only counts and ids, never tweet text (the data is real and CC BY-NC-SA).
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from datetime import datetime

import pytest
from support.twcs import TWCS, needs_twcs

from dplora.data.twcs import PAIR_COLUMNS, load_twcs_pairs, write_twcs_pairs
from dplora.data.twcs_tweets import plain_text, read_twcs_rows
from dplora.errors import BadInputError


@pytest.fixture(scope="module")
def pairs() -> list[dict[str, str]]:
    if not TWCS.exists():
        pytest.skip(f"TWCS sample not present at {TWCS}")
    return load_twcs_pairs(TWCS)


@needs_twcs
def test_reader_yields_exactly_5000_rows():
    rows = read_twcs_rows(TWCS)
    assert len(rows) == 5000
    assert Counter(r["inbound"] for r in rows) == {"True": 2778, "False": 2222}
    assert any(r["tweet_id"] == "3399" for r in rows)


@needs_twcs
def test_pairs_shape(pairs):
    assert len(pairs) > 1000
    for p in pairs:
        assert tuple(p) == PAIR_COLUMNS
        assert p["customer_id"].isdigit(), f"non-numeric customer_id for tweet {p['tweet_id']}"
        assert "\r" not in p["message"] and "\r" not in p["reply"]
    assert len({p["tweet_id"] for p in pairs}) == len(pairs)


@needs_twcs
def test_customers_and_multi_pair_customers(pairs):
    counts = Counter(p["customer_id"] for p in pairs)
    assert 500 < len(counts) <= 1443  # at most the 1,443 distinct customers in the sample
    assert max(counts.values()) >= 5
    assert sum(c > 1 for c in counts.values()) >= 100


@needs_twcs
def test_first_reply_matches_independent_join(pairs):
    rows = read_twcs_rows(TWCS)
    fmt = "%a %b %d %H:%M:%S %z %Y"
    replies: dict[str, list[tuple[datetime, int, str]]] = {}
    for r in rows:
        if r["inbound"] == "False" and r["in_response_to_tweet_id"]:
            key = str(int(float(r["in_response_to_tweet_id"])))
            replies.setdefault(key, []).append((datetime.strptime(r["created_at"], fmt), int(r["tweet_id"]), r["text"]))
    author = {r["tweet_id"]: r["author_id"] for r in rows}

    def redacted(text: str, customer: str) -> str:  # issue 41: every numbered id but the customer's is redacted
        return re.sub(r"@(\d[\w.-]*\w|\d)", lambda m: m[0] if m[1] == customer else "@customer", plain_text(text))

    expected = {
        r["tweet_id"]: redacted(min(replies[r["tweet_id"]])[2], author[r["tweet_id"]])
        for r in rows
        if r["inbound"] == "True" and r["tweet_id"] in replies
    }
    got = {p["tweet_id"]: p["reply"] for p in pairs}
    assert got.keys() == expected.keys()
    mismatched = [t for t in got if got[t] != expected[t]]
    assert not mismatched, f"{len(mismatched)} pairs picked a different first reply"


@needs_twcs
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_write_round_trip_and_stats(tmp_path, pairs, suffix):
    dest = tmp_path / f"pairs{suffix}"
    info = write_twcs_pairs(TWCS, dest)
    if suffix == ".csv":
        with dest.open(newline="", encoding="utf-8") as fh:
            back = list(csv.DictReader(fh))
    else:
        back = [json.loads(line) for line in dest.read_text(encoding="utf-8").splitlines()]
    assert back == pairs
    counts = sorted(Counter(p["customer_id"] for p in pairs).values())
    assert info["path"] == str(dest)
    assert info["num_pairs"] == len(pairs) and info["num_customers"] == len(counts)
    stats = info["records_per_customer"]
    assert set(stats) == {"min", "median", "p95", "max"}
    assert stats["min"] == counts[0] >= 1 and stats["max"] == counts[-1]
    assert stats["min"] <= stats["median"] <= stats["p95"] <= stats["max"]


def test_missing_file_is_bad_input(tmp_path):
    with pytest.raises(BadInputError, match="not found"):
        load_twcs_pairs(tmp_path / "nope.csv")


def test_bare_cr_and_float_parent_ids(tmp_path):
    src = tmp_path / "mini.csv"
    src.write_bytes(
        b",tweet_id,author_id,inbound,created_at,text,response_tweet_id,in_response_to_tweet_id\n"
        b'0,1,115712,True,Tue Oct 31 22:10:47 +0000 2017,hello\rthere,"2,3",\n'
        b"1,3,BrandB,False,Tue Oct 31 22:12:00 +0000 2017,later reply,,1.0\n"
        b"2,2,BrandA,False,Tue Oct 31 22:11:00 +0000 2017,first reply,,1.0\n"
        b"3,4,115713,True,Tue Oct 31 22:13:00 +0000 2017,no answer,,\n"
    )
    assert len(read_twcs_rows(src)) == 4
    assert load_twcs_pairs(src) == [
        {"customer_id": "115712", "tweet_id": "1", "message": "hello there", "reply": "first reply"}
    ]


def test_first_reply_tie_breaks_on_smallest_tweet_id(tmp_path):
    src = tmp_path / "tie.csv"
    src.write_text(
        ",tweet_id,author_id,inbound,created_at,text,response_tweet_id,in_response_to_tweet_id\n"
        "0,10,42,True,Tue Oct 31 22:10:47 +0000 2017,question,,\n"
        "1,30,BrandA,False,Tue Oct 31 22:11:00 +0000 2017,reply 30,,10.0\n"
        "2,20,BrandA,False,Tue Oct 31 22:11:00 +0000 2017,reply 20,,10.0\n",
        encoding="utf-8",
    )
    assert [p["reply"] for p in load_twcs_pairs(src)] == ["reply 20"]
