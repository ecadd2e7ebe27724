"""Helpers shared by tests/golden/test_golden.py and its slow tier under tests/slow/."""

from __future__ import annotations

import os

WRITE = os.environ.get("DPLORA_GOLDEN_WRITE") == "1"
