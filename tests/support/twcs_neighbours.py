"""Helpers shared by tests/data/test_twcs_neighbours.py and its slow tier under tests/slow/."""

from __future__ import annotations

from pathlib import Path

from conftest import SHARED

TWCS = SHARED / "data" / "twcs_customer_support_twitter" / "twcs_first5000.csv"


HEADER = ",tweet_id,author_id,inbound,created_at,text,response_tweet_id,in_response_to_tweet_id\n"


def shared_csv(path: Path, tweets: list[tuple]) -> Path:
    """tweets: (tweet_id, author, inbound, minute, text, parent or '')."""
    lines = [
        f'{i},{tid},{author},{inbound},Tue Oct 31 22:{minute:02d}:00 +0000 2017,"{text}",,{parent}\n'
        for i, (tid, author, inbound, minute, text, parent) in enumerate(tweets)
    ]
    path.write_text(HEADER + "".join(lines), encoding="utf-8")
    return path
