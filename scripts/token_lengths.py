"""Token lengths of whole conversations through the packaged model's chat template (issue 31, item 4).

Renders each conversation with SmolLM2-135M-Instruct's own template (``tokenizer.apply_chat_template``, as
training does for ``messages`` records: the template adds its default system prompt when a conversation has none)
and counts tokens. Data: the shared Bitext pairs (``instruction`` → ``response`` as one-turn conversations), TWCS
conversations (:func:`dplora.data.twcs.load_twcs_conversations`) and the demo conversations (``dplora demo-data
--format messages``: 1000 tickets, seed 0). Prints nearest-rank percentiles (p50, p90, p95, p99, max), as a table
and one JSON line, and the smallest multiple of 64 that keeps ≥ 95 % of the Bitext and of the demo conversations
whole. Tokenizer only (no weights are loaded): seconds.

    python scripts/token_lengths.py [--shared ../shared/data] [--tokenizer FOLDER]

Only lengths are printed, never text (TWCS is real data, CC BY-NC-SA).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))
KEEP = 0.95  # the share of whole conversations the default max_seq_len keeps


def nearest_rank(values: list[int], q: float) -> int:
    """The smallest value with at least ``q`` of ``values`` at or below it (nearest-rank percentile)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def lengths(tokenizer, conversations: list[list[dict]]) -> list[int]:
    """Tokens of each whole conversation rendered by the tokenizer's own chat template (no generation prompt)."""
    out = []
    for messages in conversations:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        out.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


def bitext(folder: Path) -> list[list[dict]]:
    path = folder / "bitext_customer_support" / "Bitext_Sample_Customer_Support_Training_Dataset.csv"
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [
        [{"role": "user", "content": r["instruction"]}, {"role": "assistant", "content": r["response"]}] for r in rows
    ]


def twcs(folder: Path) -> list[list[dict]]:
    from dplora.data.twcs import load_twcs_conversations

    path = folder / "twcs_customer_support_twitter" / "twcs_first5000.csv"
    return [r["messages"] for r in load_twcs_conversations(path)]


def demo() -> list[list[dict]]:
    from dplora.data.demo import DEFAULT_CONVERSATION_TURNS, generate_tickets, ticket_conversations

    rows = generate_tickets(num_tickets=1000, seed=0, max_turns=DEFAULT_CONVERSATION_TURNS)
    return [r["messages"] for r in ticket_conversations(rows)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--tokenizer", type=Path, default=None, help="Default: the converted packaged model.")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    if args.tokenizer is None:
        from dplora.engine.model import converted_smollm2

        args.tokenizer = converted_smollm2(log=lambda m: print(m, file=sys.stderr))
    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    sets = {
        "bitext (1 turn)": bitext(args.shared),
        "twcs conversations": twcs(args.shared),
        "demo conversations": demo(),
    }
    table = {}
    for name, conversations in sets.items():
        n = lengths(tokenizer, conversations)
        table[name] = {"records": len(n)} | {k: nearest_rank(n, q) for k, q in PERCENTILES}
    keep = max(table["bitext (1 turn)"]["p95"], table["demo conversations"]["p95"])
    default = 64 * math.ceil(keep / 64)
    print(f"{'data':22} {'records':>7} " + " ".join(f"{k:>5}" for k, _ in PERCENTILES))
    for name, row in table.items():
        print(f"{name:22} {row['records']:7d} " + " ".join(f"{row[k]:5d}" for k, _ in PERCENTILES))
    print(f"max_seq_len keeping ≥ {KEEP:.0%} of Bitext and demo conversations whole, rounded up to 64: {default}")
    print(json.dumps({"tokens": table, "suggested_max_seq_len": default}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
