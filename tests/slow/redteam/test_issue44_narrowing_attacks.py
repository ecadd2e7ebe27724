"""Red team of issue 44 (the narrowing refactor: functions take the contract's sections, not the ``Contract``;
56 function-level imports hoisted to module headers). Each test states a guarantee the refactor could have broken
and FAILS if it no longer holds. No model is trained: data, ledger and resume checks are called directly, and the
ranks' digests come from ``train._admit`` on a second rank with the collectives stubbed.

Attacks (see the report of red team 44):
  A1 eval_fraction split by unit: one side per unit, the keyed-hash rule, same split in budget/train/eval.
  A2 eval_path without (or with a blank) unit key column: read, never refused; no cell text in errors.
  A3 row-level eval_fraction: the unit id is the record's text (duplicates fall together).
  A4 public sample (clip-guide --public / sweep --eval-public): the unit key read only with ``units``; private
     files (data.path, a non-public eval_path, a symlink to either) refused.
  A5 resume: a changed unit key, or data changed only in its unit key column, refused.
  A6 ranks' input digests cover the unit key column (through train._admit).
  A7 synth's verbatim check reads the data as training does (with the unit key).
  A8 ledger charges of a control (privacy.enabled: false) after is_control takes the privacy section.
  A9 no name a test monkeypatches was hoisted into a module-level ``from ... import`` (a dead seam).
  A10 ``dplora budget`` stays light with --sweep and an eval_path lacking the unit key.
"""

from __future__ import annotations

from pathlib import Path

from conftest import budget_in_subprocess


def _csv(path: Path, header: str, rows: list[str]) -> str:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return str(path)


def test_a10_budget_sweep_with_an_eval_path_lacking_the_unit_key_stays_light(tmp_path):
    rows = [f"u{i % 120},question {i},answer {i}" for i in range(300)]
    _csv(tmp_path / "data.csv", "user_id,message,reply", rows)
    _csv(tmp_path / "held.csv", "message,reply", ["hq,ha", "hq2,ha2"])
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
