"""Tests for dplora.data.demo: the fake support-ticket generator."""

from __future__ import annotations

import csv
import json
import re
from collections import Counter

import pytest

from dplora.data.demo import COLUMNS, INTENTS, generate_tickets, write_tickets
from dplora.errors import BadInputError

EMAIL = re.compile(r"[\w.+-]+@([\w-]+(?:\.[\w-]+)+)")


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    return generate_tickets(num_tickets=1000, seed=0)


def test_exact_columns_and_str_values(rows):
    for row in rows:
        assert tuple(row) == COLUMNS
        assert all(isinstance(v, str) and v for v in row.values())


@pytest.mark.parametrize("n", [1, 2, 7, 999, 1000])
def test_num_tickets_exact(n):
    assert len(generate_tickets(num_tickets=n, seed=3)) == n


def test_tickets_per_customer_between_1_and_5(rows):
    counts = Counter(r["customer_id"] for r in rows)
    assert all(1 <= c <= 5 for c in counts.values())
    assert sum(c > 1 for c in counts.values()) >= 50
    assert set(counts.values()) == {1, 2, 3, 4, 5}


def test_ids_unique_and_formatted(rows):
    ids = [r["ticket_id"] for r in rows]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"T-\d{6}", t) for t in ids)
    assert all(re.fullmatch(r"C-\d{5}", r["customer_id"]) for r in rows)


def test_deterministic_by_seed():
    assert generate_tickets(num_tickets=200, seed=7) == generate_tickets(num_tickets=200, seed=7)
    assert generate_tickets(num_tickets=200, seed=7) != generate_tickets(num_tickets=200, seed=8)


def test_emails_only_on_example_domains(rows):
    domains = Counter(m.group(1) for r in rows for m in EMAIL.finditer(r["message"] + " " + r["reply"]))
    assert domains, "expected some emails in the text"
    assert set(domains) <= {"example.com", "example.org", "example.net"}


def test_fake_details_present_and_fictional(rows):
    text = " ".join(r["message"] + " " + r["reply"] for r in rows)
    phones = re.findall(r"\+1-\d{3}-\d{4}", text)
    assert phones and all(re.fullmatch(r"\+1-555-01\d\d", p) for p in phones)
    assert re.search(r"ORD-\d{6}", text)
    assert len(INTENTS) >= 15


def test_customer_keeps_same_email(rows):
    by_customer: dict[str, set[str]] = {}
    for r in rows:
        for m in EMAIL.finditer(r["message"] + " " + r["reply"]):
            by_customer.setdefault(r["customer_id"], set()).add(m.group(0))
    assert by_customer
    assert all(len(emails) == 1 for emails in by_customer.values())


def test_text_not_trivially_repetitive(rows):
    assert len({r["message"] for r in rows}) >= 0.9 * len(rows)
    assert len({r["reply"] for r in rows}) >= 0.9 * len(rows)


@pytest.mark.parametrize("column", ["message", "reply"])
def test_word_counts_within_bounds(rows, column):
    words = [len(r[column].split()) for r in rows]
    assert sum(15 <= w <= 45 for w in words) >= 0.95 * len(rows)
    assert max(words) <= 60


def test_csv_round_trip(tmp_path):
    path = tmp_path / "t.csv"
    info = write_tickets(path, num_tickets=150, seed=1)
    with path.open(newline="", encoding="utf-8") as fh:
        back = list(csv.DictReader(fh))
    assert back == generate_tickets(num_tickets=150, seed=1)
    counts = Counter(r["customer_id"] for r in back)
    assert info["path"] == str(path)
    assert info["num_tickets"] == 150 and info["num_customers"] == len(counts)
    per = info["tickets_per_customer"]
    assert (per["min"], per["max"]) == (min(counts.values()), max(counts.values()))
    assert per["mean"] == pytest.approx(150 / len(counts), abs=1e-3)


def test_jsonl_round_trip(tmp_path):
    path = tmp_path / "sub" / "t.jsonl"
    write_tickets(path, num_tickets=80, seed=2)
    back = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert back == generate_tickets(num_tickets=80, seed=2)


def test_bad_suffix_refused(tmp_path):
    with pytest.raises(BadInputError, match=r"\.csv.*\.jsonl"):
        write_tickets(tmp_path / "t.txt", num_tickets=5)
    assert not list(tmp_path.iterdir())


def test_overwrite_refused_then_allowed(tmp_path):
    path = tmp_path / "t.csv"
    write_tickets(path, num_tickets=5, seed=0)
    before = path.read_bytes()
    with pytest.raises(BadInputError, match="exists"):
        write_tickets(path, num_tickets=9, seed=1)
    assert path.read_bytes() == before
    assert write_tickets(path, num_tickets=9, seed=1, overwrite=True)["num_tickets"] == 9
    assert [p.name for p in tmp_path.iterdir()] == ["t.csv"]  # no temp files left behind


@pytest.mark.parametrize("n", [0, -1, 2.5, True, "10"])
def test_bad_num_tickets(n):
    with pytest.raises(BadInputError):
        generate_tickets(num_tickets=n)


def test_multi_turn_tickets_share_ids_and_customers():
    """max_turns=3: tickets have 1-3 rows, each ticket belongs to one customer, customers have several tickets."""
    from collections import Counter, defaultdict

    rows = generate_tickets(num_tickets=200, seed=3, max_turns=3)
    per_ticket = Counter(r["ticket_id"] for r in rows)
    assert len(per_ticket) == 200
    assert set(per_ticket.values()) == {1, 2, 3}
    owners = defaultdict(set)
    for r in rows:
        owners[r["ticket_id"]].add(r["customer_id"])
    assert all(len(v) == 1 for v in owners.values())
    tickets_per_customer = Counter(next(iter(v)) for v in owners.values())
    assert max(tickets_per_customer.values()) > 1
