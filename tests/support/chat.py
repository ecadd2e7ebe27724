"""Helpers shared by tests/data/test_chat.py and its slow tier under tests/slow/."""

from __future__ import annotations

IGN = -100


CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Order 12 is late"},
    {"role": "assistant", "content": "Sorry, resent."},
    {"role": "user", "content": "Thanks"},
    {"role": "assistant", "content": "Welcome!"},
]
