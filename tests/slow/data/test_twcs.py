"""Tests for dplora.data.twcs on the shared TWCS 5,000-row sample (skipped when the file is absent).

Assertions report only counts and ids, never tweet text (the data is real and CC BY-NC-SA).
"""

from __future__ import annotations

import pytest
from conftest import SHARED

from dplora.data.twcs import write_twcs_pairs
from dplora.errors import BadInputError

TWCS = SHARED / "data" / "twcs_customer_support_twitter" / "twcs_first5000.csv"


needs_twcs = pytest.mark.skipif(not TWCS.exists(), reason=f"TWCS sample not present at {TWCS}")


@needs_twcs
def test_write_refusals(tmp_path):
    with pytest.raises(BadInputError):
        write_twcs_pairs(TWCS, tmp_path / "pairs.parquet")
    dest = tmp_path / "pairs.csv"
    dest.write_text("keep me", encoding="utf-8")
    with pytest.raises(BadInputError, match="exists"):
        write_twcs_pairs(TWCS, dest)
    assert dest.read_text(encoding="utf-8") == "keep me"
