"""The slow tier of tests/data/test_twcs_conversations.py, whose docstring describes the module."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import SHARED

from dplora.data.twcs import load_twcs_conversations

TWCS = SHARED / "data" / "twcs_customer_support_twitter" / "twcs_first5000.csv"


def test_roles_alternate_from_user_to_assistant_on_the_real_file():
    if not TWCS.exists():
        pytest.skip(f"TWCS sample not present at {TWCS}")
    stats = Counter()
    rows = load_twcs_conversations(TWCS, stats)
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles[0] == "user" and roles[-1] == "assistant"
        assert all(x != y for x, y in zip(roles, roles[1:], strict=False))
    # counts of this 5,000-row sample (issue 31's note): 1,312 threads, 1,210 conversations of 1,197 customers
    assert (stats["threads"], stats["conversations"], len({r["customer_id"] for r in rows})) == (1312, 1210, 1197)
    assert stats["threads_dropped_by_rule"] == 75 and stats["threads_dropped_no_customer_root"] == 27
    customers = {r["customer_id"] for r in rows}
    for row in rows:  # no record holds a tweet written by someone other than its customer or a brand
        others = customers - {row["customer_id"]}
        assert not any(f"@{o}" in m["content"].split() for m in row["messages"] for o in others)
