"""The slow tier of tests/engine/test_hub_model.py, whose docstring describes the module."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import release_statement
from support.hub_model import COMMIT, build_hub_cache
from support.hub_train import train_hub_id

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


@pytest.fixture
def hub_cache(tmp_path, tiny_model_dir, monkeypatch) -> Path:
    return build_hub_cache(tmp_path, tiny_model_dir, monkeypatch)


def test_train_from_a_hub_id_names_id_and_commit_in_record_and_card(tmp_path, hub_cache, tickets_csv, signing_key):
    result = train_hub_id(tmp_path, tickets_csv, signing_key, "tiny-org/tiny-llama")
    assert result.exit_code == 0, result.output
    base = release_statement(tmp_path / "run")["predicate"]["base_model"]
    assert (base["name_or_path"], base["revision"], base["commit"]) == ("tiny-org/tiny-llama", "main", COMMIT)
    card = (tmp_path / "run" / "adapter" / "README.md").read_text()
    assert "base_model: tiny-org/tiny-llama" in card and COMMIT in card
