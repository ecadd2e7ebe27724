"""Helpers shared by tests/engine/test_warm_start_attacks.py and its slow tier under tests/slow/."""

from __future__ import annotations

from pathlib import Path

from dplora.data.demo import write_tickets

CANARY = "PRIVATE-CANARY-7f3a"


WARM = {"steps": 4, "batch_size": 4, "lr": 0.05}


PUBLIC_TICKETS = 30


def write_private(path: Path, rows: int = 40) -> Path:
    """A private csv with the demo tickets' columns (those of the public files here: a team's public and private
    exports share a header); every record carries CANARY, so any read of it can be seen."""
    lines = ["ticket_id,customer_id,message,reply"] + [
        f"T-{i:06d},C-{i:05d},{CANARY} my card {i:04d} was charged twice,{CANARY} refund {i} sent" for i in range(rows)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def decoded_texts(examples) -> list[str]:
    """The text of each tokenised example (byte tokenizer; special ids dropped)."""
    from tiny import byte_tokenizer

    tok = byte_tokenizer()
    return [tok.decode([t for t in ids if t < 256]) for ids, _ in examples]


def glob_public(tmp_path: Path, name: str) -> Path:
    """A public file of PUBLIC_TICKETS demo tickets at ``tmp_path / name`` (a name that may read as a pattern)."""
    public = tmp_path / name
    public.parent.mkdir(parents=True, exist_ok=True)
    write_tickets(public, num_tickets=PUBLIC_TICKETS, seed=4242)
    return public
