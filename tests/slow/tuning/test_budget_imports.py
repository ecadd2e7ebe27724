"""The slow tier of tests/tuning/test_budget_imports.py, whose docstring describes the module."""

from __future__ import annotations

import pytest
from conftest import budget_in_subprocess

CONTRACT = """\
privacy: {protected_unit: user, unit_key: user_id, adjacency: add_remove, target_epsilon: 8, delta: 1.0e-5,
          max_grad_norm: 1.0, num_units: 100, max_records_per_unit: 2}
model: {path: /nonexistent}
data: {path: data.csv, prompt_column: message, response_column: reply, eval_fraction: 0.1}
training: {expected_batch_size: 16, steps: 20}
"""


@pytest.mark.parametrize("held_out", ["eval_fraction: 0.1", "eval_path: held.csv"])
def test_budget_with_the_default_accountant_imports_no_torch_stack_nor_datasets(tmp_path, held_out):
    (tmp_path / "contract.yaml").write_text(CONTRACT.replace("eval_fraction: 0.1", held_out))  # accountant: default
    rows = ["user_id,message,reply"] + [f"u{i % 120},question {i},answer {i}" for i in range(300)]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "held.csv").write_text("\n".join(rows[:20]) + "\n")
    probe, report, _ = budget_in_subprocess(tmp_path)
    assert probe == {"code": 0, "heavy": []}
    assert report["accountant"] == "prv" and report["epsilon"] <= 8
    stats = report["not_covered_by_dp"]["unit_stats"]
    assert stats["max_records_per_unit_after_cap"] == 2 and stats["dropped_by_cap"] > 0  # the data was read


def test_budget_recommend_imports_no_torch_stack(tmp_path):
    (tmp_path / "contract.yaml").write_text(CONTRACT.replace("num_units: 100", "num_units: 1000"))
    probe, report, _ = budget_in_subprocess(tmp_path, "--recommend", "--max-steps", "60")
    assert probe == {"code": 0, "heavy": []}
    assert report["recommendation"]["choice"]["steps"] <= 60 == report["recommendation"]["inputs"]["max_steps"]
