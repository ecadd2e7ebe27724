"""Helpers shared by tests/tuning/test_clipguide_messages.py and its slow tier under tests/slow/."""

from __future__ import annotations

NO_PAIR = {"prompt_column": None, "response_column": None}
