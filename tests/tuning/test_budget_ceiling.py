"""``dplora budget`` states the attack ceiling (issue 46 item 1): text, --json, the planner's candidate table, and
identical values on neighbouring data files (declared N: the ceiling reads q, σ, T and adjacency only).

Reference: ../shared/cases/README.md F7 row 2 (q 32/4214, σ 0.417, T 12: TPR 0.0089 / 0.0306 / 0.1411 at FPR
0.1 / 1 / 10 %), which holds whatever accountant the plan's ε uses (the ceiling is always the PLD profile's).
"""

from __future__ import annotations

import json

import pytest
from support.budget_ceiling import config
from typer.testing import CliRunner

from dplora.cli.app import app


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


def _json(*args) -> dict:
    res = CliRunner().invoke(app, ["budget", *map(str, args), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_neighbouring_data_files_give_identical_ceilings(tmp_path):
    big = _json(config(tmp_path, 100, "a.yaml"))
    small = _json(config(tmp_path, 99, "b.yaml"))  # one row removed; N declared 4214 in both
    assert big["attack_ceiling"] == small["attack_ceiling"]
