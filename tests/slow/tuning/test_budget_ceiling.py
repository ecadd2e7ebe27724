"""The slow tier of tests/tuning/test_budget_ceiling.py, whose docstring describes the module."""

from __future__ import annotations

import pytest
from support.budget_ceiling import CONTRACT, config, shared_json
from typer.testing import CliRunner

from dplora.cli.app import app


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch, fresh_cache):
    monkeypatch.chdir(tmp_path)


def test_budget_json_and_text_state_f7s_ceiling(tmp_path):
    report = shared_json(config(tmp_path, 100))
    entry = report["attack_ceiling"]
    assert entry["available"] is True
    assert entry["true_positive_rate_at"] == pytest.approx({"0.1%": 0.0089, "1%": 0.0306, "10%": 0.1411}, abs=0.002)
    assert "PLD" in entry["method"] and entry["accountant_version"].startswith("dp-accounting")
    res = CliRunner().invoke(app, ["budget", str(config(tmp_path, 100))])
    assert res.exit_code == 0, res.output
    assert "3.06 % at 1 %" in res.stdout
    assert "no test of whether one row was used can exceed 3.1 % true positives at 1 % false positives" in res.stdout


def test_planner_table_shows_each_candidates_ceiling(tmp_path):
    """--recommend at ε 8 with epochs: auto: the two candidates weighed (B 256 at E 3, T 50; B 384 at E 5, T 55) state
    different ceilings; the chosen one is the plan's."""
    cfg = tmp_path / "auto.yaml"
    cfg.write_text(
        CONTRACT.replace("target_epsilon: 20", "target_epsilon: 8")
        .replace(", noise_multiplier: 0.417", "")
        .replace("{expected_batch_size: 32, steps: 12}", "{expected_batch_size: auto, epochs: auto, max_epochs: 5}")
    )
    report = shared_json(cfg, "--recommend")
    rec = report["recommendation"]
    calibrated = [c for c in rec["candidates"] if c["noise_multiplier"] is not None]
    assert [(c["expected_batch_size"], c["steps"]) for c in calibrated] == [(256, 50), (384, 55)]
    tprs = [c["attack_ceiling"]["1%"] for c in calibrated]
    assert all(0.01 < t < 1.0 for t in tprs) and len(set(tprs)) > 1
    chosen = rec["choice"]["attack_ceiling"]
    plan = report["attack_ceiling"]["true_positive_rate_at"]
    assert chosen == pytest.approx(plan, abs=2e-4)  # interval 1e-3 in the table, 1e-4 in the plan
    res = CliRunner().invoke(app, ["budget", str(cfg), "--recommend"])
    assert res.exit_code == 0 and "TPR@1%" in res.stdout and "attack ceiling:" in res.stdout
