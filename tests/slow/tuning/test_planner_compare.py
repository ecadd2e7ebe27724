"""scripts/planner_compare.py --toy: the planner row against the hand row on a tiny model (issue 29)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "planner_compare.py"


def test_toy_comparison_writes_both_rows(tmp_path):
    spec = importlib.util.spec_from_file_location("planner_compare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--toy", "--repeats", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "planner_compare.json").read_text())
    hand, planner = report["arms"]["hand"], report["arms"]["planner"]
    assert hand["settings"]["B"] == 32 and hand["settings"]["lr"] == 0.002
    assert hand["settings"]["lr_schedule"] == "constant"
    # the planner's rule on the toy's public N (204 rows, E = 8): B ≤ N/4 = 51, T ≥ 50 -> B = 32 or 48
    assert planner["settings"]["B"] in (32, 48) and planner["settings"]["lr_schedule"] == "constant"
    assert planner["settings"]["T"] >= 50
    for arm in (hand, planner):
        assert len(arm["losses"]) == 1 and arm["mean"] > 0
    assert report["base_loss"] > 0 and report["control_loss"] > 0
    assert "| planner |" in (tmp_path / "planner_compare.md").read_text()
