"""Issue 31: `dplora demo-data --format messages` writes one conversation per ticket (ticket_id, customer_id,
messages), some multi-turn (a follow-up user turn and agent reply), deterministic from the seed."""

from __future__ import annotations

import json
from collections import Counter

from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.data.demo import COLUMNS, generate_tickets

runner = CliRunner()


def _read(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_demo_data_messages_writes_one_conversation_per_ticket(tmp_path):
    out = tmp_path / "chat.jsonl"
    result = runner.invoke(app, ["demo-data", str(out), "--format", "messages", "--tickets", "60", "--seed", "4"])
    assert result.exit_code == 0, result.output
    assert "wrote 60 conversations: 60 tickets" in result.output
    rows = _read(out)
    assert len(rows) == 60 and all(list(r) == ["ticket_id", "customer_id", "messages"] for r in rows)
    turns = Counter(len(r["messages"]) for r in rows)
    assert set(turns) == {2, 4} and turns[4] >= 15  # about half the tickets have a follow-up exchange
    for r in rows:
        assert [m["role"] for m in r["messages"]] == ["user", "assistant"] * (len(r["messages"]) // 2)
    # the same exchanges as the rows format with --max-turns 2, grouped by ticket
    flat = generate_tickets(num_tickets=60, seed=4, max_turns=2)
    pairs = [
        (m["content"], a["content"]) for r in rows for m, a in zip(r["messages"][::2], r["messages"][1::2], strict=True)
    ]
    assert pairs == [(f["message"], f["reply"]) for f in flat]
    by_ticket = {f["ticket_id"]: f["customer_id"] for f in flat}
    assert {r["ticket_id"]: r["customer_id"] for r in rows} == by_ticket
    # deterministic from the seed
    again = tmp_path / "again.jsonl"
    runner.invoke(app, ["demo-data", str(again), "--format", "messages", "--tickets", "60", "--seed", "4"])
    assert again.read_bytes() == out.read_bytes()
    other = tmp_path / "other.jsonl"
    runner.invoke(app, ["demo-data", str(other), "--format", "messages", "--tickets", "60", "--seed", "5"])
    assert other.read_bytes() != out.read_bytes()


def test_demo_data_messages_refuses_csv_and_the_rows_format_is_unchanged(tmp_path):
    refused = runner.invoke(app, ["demo-data", str(tmp_path / "c.csv"), "--format", "messages", "--tickets", "3"])
    assert refused.exit_code == 2 and "jsonl" in refused.output and not (tmp_path / "c.csv").exists()
    bad = runner.invoke(app, ["demo-data", str(tmp_path / "c.jsonl"), "--format", "chat", "--tickets", "3"])
    assert bad.exit_code == 2 and not (tmp_path / "c.jsonl").exists()
    rows = tmp_path / "rows.jsonl"
    assert runner.invoke(app, ["demo-data", str(rows), "--tickets", "20", "--seed", "2"]).exit_code == 0
    expected = [{k: t[k] for k in COLUMNS} for t in generate_tickets(num_tickets=20, seed=2)]
    assert _read(rows) == expected and len(expected) == 20  # one row per ticket by default, as before
