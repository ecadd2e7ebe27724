"""Helpers shared by tests/engine/test_overflow.py and its slow tier under tests/slow/."""

from __future__ import annotations

C = 1.0
