"""Helpers shared by tests/tuning/test_budget_ceiling.py and its slow tier under tests/slow/."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dplora.cli.app import app

CONTRACT = """\
privacy: {protected_unit: row, adjacency: add_remove, target_epsilon: 20, delta: 1.0e-6, accountant: rdp,
          max_grad_norm: 1.0, num_units: 4214, noise_multiplier: 0.417}
model: {path: /nonexistent}
data: {path: data.csv, prompt_column: message, response_column: reply}
training: {expected_batch_size: 32, steps: 12}
"""


def config(tmp_path: Path, rows: int, name: str = "contract.yaml") -> Path:
    data = tmp_path / f"data{rows}.csv"
    data.write_text("message,reply\n" + "".join(f"question {i},answer {i}\n" for i in range(rows)))
    path = tmp_path / name
    path.write_text(CONTRACT.replace("data.csv", data.name))
    return path


def shared_json(*args) -> dict:
    res = CliRunner().invoke(app, ["budget", *map(str, args), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)
