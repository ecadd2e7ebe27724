"""The slow tier of tests/data/test_twcs.py, whose docstring describes the module."""

from __future__ import annotations

import pytest
from support.twcs import TWCS, needs_twcs

from dplora.data.twcs import write_twcs_pairs
from dplora.errors import BadInputError


@needs_twcs
def test_write_refusals(tmp_path):
    with pytest.raises(BadInputError):
        write_twcs_pairs(TWCS, tmp_path / "pairs.parquet")
    dest = tmp_path / "pairs.csv"
    dest.write_text("keep me", encoding="utf-8")
    with pytest.raises(BadInputError, match="exists"):
        write_twcs_pairs(TWCS, dest)
    assert dest.read_text(encoding="utf-8") == "keep me"
