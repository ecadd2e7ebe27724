"""Helpers shared by tests/data/test_twcs.py and its slow tier under tests/slow/."""

from __future__ import annotations

import pytest
from conftest import SHARED

TWCS = SHARED / "data" / "twcs_customer_support_twitter" / "twcs_first5000.csv"


needs_twcs = pytest.mark.skipif(not TWCS.exists(), reason=f"TWCS sample not present at {TWCS}")
