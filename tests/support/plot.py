"""Helpers shared by tests/evaluate/test_plot.py and its slow tier under tests/slow/."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dplora.cli.app import app


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def fake_run(tmp_path, entries, target=3.0):
    out = tmp_path / "run"
    out.mkdir()
    (out / "contract.yaml").write_text(f"privacy: {{target_epsilon: {target}}}\n")
    private = tmp_path / "run.private"
    private.mkdir()
    lines = [{"note": "header"}, *entries, {"eval": {"loss": 1.0}}]
    (private / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    return out
