"""``dplora budget`` states the attack ceiling (issue 46 item 1): text, --json, the planner's candidate table, and
identical values on neighbouring data files (declared N: the ceiling reads q, σ, T and adjacency only).

Reference: ../shared/cases/README.md F7 row 2 (q 32/4214, σ 0.417, T 12: TPR 0.0089 / 0.0306 / 0.1411 at FPR
0.1 / 1 / 10 %), which holds whatever accountant the plan's ε uses (the ceiling is always the PLD profile's).
"""

from __future__ import annotations

import pytest
from support.budget_ceiling import config, shared_json


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch, fresh_cache):
    monkeypatch.chdir(tmp_path)


def test_neighbouring_data_files_give_identical_ceilings(tmp_path):
    big = shared_json(config(tmp_path, 100, "a.yaml"))
    small = shared_json(config(tmp_path, 99, "b.yaml"))  # one row removed; N declared 4214 in both
    assert big["attack_ceiling"] == small["attack_ceiling"]
