"""The slow tier of tests/data/test_twcs_neighbours.py, whose docstring describes the module."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
from support.twcs_neighbours import TWCS, shared_csv

from dplora.data.twcs import write_twcs_conversations, write_twcs_pairs
from dplora.data.twcs_tweets import read_twcs_rows
from dplora.errors import BadInputError


def _without(rows: list[dict[str, str]], customer: str) -> list[dict[str, str]]:
    """``rows`` without ``customer``'s conversation: their tweets and the brand tweets answering them (an
    independent walk: a brand tweet goes when its parent went)."""
    gone = {r["tweet_id"] for r in rows if r["author_id"] == customer}
    changed = True
    while changed:
        changed = False
        for r in rows:
            parent = r["in_response_to_tweet_id"].split(".")[0]
            if r["inbound"] == "False" and r["tweet_id"] not in gone and parent in gone:
                gone.add(r["tweet_id"])
                changed = True
    return [r for r in rows if r["tweet_id"] not in gone]


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _records(path: Path, mode: str, tmp: Path) -> list[str]:
    """The written file's lines (bytes as text), one per record."""
    dest = tmp / f"out-{mode}.jsonl"
    dest.unlink(missing_ok=True)
    (write_twcs_conversations if mode == "conversations" else write_twcs_pairs)(path, dest)
    return dest.read_text(encoding="utf-8").splitlines()


def _customer(line: str) -> str:
    return json.loads(line)["customer_id"]


def _picked(rows: list[dict[str, str]], k: int = 12) -> list[str]:
    """Customers to remove: every customer who is the only one some brand answered (on main, removing them made
    that brand's handle a customer's) and ``k`` random others (fixed seed)."""
    by_id = {r["tweet_id"]: r for r in rows}
    answered: dict[str, set[str]] = {}
    for r in rows:
        if r["inbound"] != "False":
            continue
        up = r
        while up is not None and up["inbound"] == "False":
            up = by_id.get(up["in_response_to_tweet_id"].split(".")[0])
        answered.setdefault(r["author_id"], set()).add(up["author_id"] if up else "")
    sole = sorted({next(iter(c)) for c in answered.values() if len(c) == 1} - {""})
    customers = sorted({r["author_id"] for r in rows if r["inbound"] == "True"} - set(sole))
    return sole + random.Random(41).sample(customers, k)


@pytest.mark.parametrize("mode", ["conversations", "pairs"])
def test_removing_one_customer_leaves_every_other_customers_records_byte_identical(tmp_path, mode):
    if not TWCS.exists():
        pytest.skip(f"TWCS sample not present at {TWCS}")
    rows = read_twcs_rows(TWCS)
    full = _records(_write(tmp_path / "full.csv", rows), mode, tmp_path)
    picked = _picked(rows)
    assert len(picked) >= 20 and "117260" in picked  # the one brand (AldiUK) 14 other customers mention
    moved = []
    for customer in picked:
        neighbour = _records(_write(tmp_path / "nb.csv", _without(rows, customer)), mode, tmp_path)
        if [x for x in full if _customer(x) != customer] != neighbour:
            moved.append(customer)
        assert all(_customer(x) != customer for x in neighbour)
    assert not moved, f"removing {len(moved)} of {len(picked)} customers changed another customer's records"


def test_same_data_control_gives_the_same_bytes(tmp_path):
    """Control: the same file twice gives the same bytes (so a difference above is the neighbour's)."""
    if not TWCS.exists():
        pytest.skip(f"TWCS sample not present at {TWCS}")
    path = _write(tmp_path / "full.csv", read_twcs_rows(TWCS))
    assert _records(path, "conversations", tmp_path) == _records(path, "conversations", tmp_path)


@pytest.mark.parametrize("mode", ["conversations", "pairs"])
@pytest.mark.parametrize("brand_answers_go", [True, False])
def test_random_threads_of_mixed_customers_are_neighbour_proof(tmp_path, mode, brand_answers_go):
    """Attack: 60 random files of 40 tweets (5 customers, 3 brands, every tweet replying to a random earlier one or
    opening a thread, mentions of everyone and of ids absent from the file). Remove one customer: their tweets,
    with or without the brand answers below them. Every other customer's records must stay byte-identical."""
    rng = random.Random(4141)
    customers, brands = ["101", "102", "103", "104", "105"], ["BrandA", "BrandB", "BrandC"]
    for trial in range(60):
        tweets = []
        for tid in range(1, 41):
            author = rng.choice(customers + brands)
            names = rng.sample([*customers, *brands, "999", "Stranger"], 2)
            parent = "" if tid == 1 or rng.random() < 0.2 else f"{rng.randrange(1, tid)}.0"
            text = f"@{names[0]} t{tid} by {author} @{names[1]}"
            tweets.append((tid, author, author in customers, tid % 60, text, parent))
        path = shared_csv(tmp_path / "full.csv", tweets)
        rows = read_twcs_rows(path)
        try:
            full = _records(path, mode, tmp_path)
        except BadInputError:  # no record at all (nothing to compare)
            continue
        for gone in customers:
            kept = _without(rows, gone) if brand_answers_go else [r for r in rows if r["author_id"] != gone]
            try:
                neighbour = _records(_write(tmp_path / "nb.csv", kept), mode, tmp_path)
            except BadInputError:
                neighbour = []
            assert [x for x in full if _customer(x) != gone] == neighbour, (trial, gone)
            assert all(f"by {gone}" not in x for x in neighbour)
