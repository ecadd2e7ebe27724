"""Attack A10 on the unit key column: ``dplora budget`` stays light (no heavy import) with --sweep and an
eval_path lacking the unit key. The fast attacks are in tests/data/test_unit_key_attacks.py."""

from __future__ import annotations

from conftest import budget_in_subprocess
from support.unit_key_attacks import write_csv


def test_a10_budget_sweep_with_an_eval_path_lacking_the_unit_key_stays_light(tmp_path):
    rows = [f"u{i % 120},question {i},answer {i}" for i in range(300)]
    write_csv(tmp_path / "data.csv", "user_id,message,reply", rows)
    write_csv(tmp_path / "held.csv", "message,reply", ["hq,ha", "hq2,ha2"])
    (tmp_path / "contract.yaml").write_text(
        "privacy: {protected_unit: user, unit_key: user_id, adjacency: add_remove, target_epsilon: 8, delta: 1.0e-5,\n"
        "          max_grad_norm: 1.0, num_units: 100, max_records_per_unit: 2}\n"
        "model: {path: /nonexistent}\n"
        "data: {path: data.csv, prompt_column: message, response_column: reply, eval_path: held.csv}\n"
        "training: {expected_batch_size: 16, steps: 20}\n"
    )
    probe, report, stderr = budget_in_subprocess(tmp_path, "--sweep")
    assert probe == {"code": 0, "heavy": []}, stderr[-2000:]
    assert report["not_covered_by_dp"]["unit_stats"]["max_records_per_unit_after_cap"] == 2  # the data was read
    assert "sweep" in report
