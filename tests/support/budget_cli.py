"""Helpers shared by tests/tuning/test_budget_cli.py and its slow tier under tests/slow/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dplora.cli.app import app

CONTRACT = """\
privacy: {protected_unit: row, adjacency: add_remove, target_epsilon: 8, delta: 1.0e-5, accountant: rdp,
          max_grad_norm: 1.0, num_units: 1000}
model: {path: /nonexistent}
data: {path: data.csv, prompt_column: message, response_column: reply}
training: {expected_batch_size: 32, steps: 24}
"""


def build_config(tmp_path):
    """The contract (N=1000 declared) and a 100-row data.csv: budget reads the data as train does."""
    path = tmp_path / "contract.yaml"
    path.write_text(CONTRACT)
    write_csv(tmp_path / "data.csv", [(f"u{i}", f"question {i}", f"answer {i}") for i in range(100)])
    return path


def write_csv(path: Path, rows: list[tuple], header=("user_id", "message", "reply")) -> Path:
    lines = [",".join(header)] + [",".join(str(c) for c in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def budget(*args: str):
    return CliRunner().invoke(app, ["budget", *[str(a) for a in args]])


def budget_json(*args: str, private: bool = True) -> dict:
    """``budget --json``; ``private`` adds ``--show-private`` (the operator's local view: records-per-unit stats,
    data-count warnings, a counted N), without it the public document a CI job would publish."""
    res = budget(*args, "--json", *(["--show-private"] if private else []))
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


# the fixtures both tiers use, bound in each module as ``_fresh_cache = budget_cli.fresh_workdir`` and
# ``config = budget_cli.budget_config``
@pytest.fixture(autouse=True)
def fresh_workdir(tmp_path, monkeypatch):
    """A fresh calibration cache per test, and the test's folder as working directory (relative data.path)."""
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def budget_config(tmp_path) -> Path:
    return build_config(tmp_path)
