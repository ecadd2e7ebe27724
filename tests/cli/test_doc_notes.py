"""What the README and docs/ say about two things a reader trips on: the ``../shared`` data a clone lacks, and
``eval --group-column``, which accepts only the contract's own (checked) column."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import needs_shared

from dplora.contract.loader import parse_contract
from dplora.errors import BadInputError

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_says_the_shared_data_is_optional_and_that_tests_skip():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "../shared" in text
    note = " ".join(text.split("`../shared/data/` (", 1)[1].split("\n\n", 1)[0].split())
    assert "not part of a clone" in note and "skips" in note and "DPLORA_SHARED_DIR" in note
    reason = needs_shared("no", "such", "folder").kwargs["reason"]
    assert "../shared is not part of a clone" in reason  # the skip reason the README quotes


def test_the_docs_never_offer_group_column_as_a_free_choice():
    for name in ("commands.md", "evaluation.md"):
        text = " ".join((ROOT / "docs" / name).read_text(encoding="utf-8").split())
        for match in re.finditer(r"--group-column", text):
            around = text[max(match.start() - 200, 0) : match.end() + 200]
            assert "only" in around, (name, around)
    evaluation = " ".join((ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8").split())
    assert "privacy.unit_key" in evaluation and "refuses" in evaluation


@pytest.mark.parametrize("column", ["reply", "customer_id"])
def test_the_contract_refuses_what_the_docs_say(column):
    raw = {
        "privacy": {
            "protected_unit": "user",
            "unit_key": "customer_id",
            "adjacency": "add_remove",
            "target_epsilon": 8.0,
            "delta": 1e-5,
            "max_grad_norm": 1.0,
            "num_units": 100,
        },
        "model": {"path": "m"},
        "data": {
            "path": "d.csv",
            "prompt_column": "message",
            "response_column": "reply",
            "eval_fraction": 0.1,
            "group_column": column,
        },
        "training": {"expected_batch_size": 8, "steps": 3},
    }
    with pytest.raises(BadInputError, match="data.group_column"):
        parse_contract(raw)
