"""The slow tier of tests/evaluate/test_plot.py, whose docstring describes the module."""

from __future__ import annotations

import json
import struct

from conftest import train_tiny
from support.plot import fake_run, run

from dplora.evaluate import plot as plot_mod


def _png_size(path):
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", raw[16:24])


def _entry(step, eps, seconds, loss):
    return {"step": step, "epsilon_upper": eps, "seconds": seconds, "not_covered_by_dp": {"train_loss": loss}}


def test_plot_reads_every_step_and_writes_a_private_png(tmp_path):
    out = fake_run(tmp_path, [_entry(1, 0.5, 2.0, 3.25), _entry(2, 0.9, 2.5, None), _entry(3, 1.2, 1.75, 2.5)])
    res = run("plot", out)
    assert res.exit_code == 0, res.output
    path = tmp_path / "run.private" / "training.png"
    assert f"wrote {path} (3 steps): PRIVATE" in res.output and "NOT covered by DP" in res.output
    assert _png_size(path) == (600, 1000)  # 6 × 10 inches at 100 dpi, as budget --plot's 100 dpi
    result = plot_mod.plot_run(out)
    assert result.series == plot_mod.Series(
        steps=[1, 2, 3], loss=[3.25, None, 2.5], epsilon=[0.5, 0.9, 1.2], seconds=[2.0, 2.5, 1.75]
    )
    assert result.path.parent == tmp_path / "run.private" and "PRIVATE" in result.title
    assert result.labels == ["loss per record (nats)", "ε", "seconds per step", "logical steps T"]
    assert plot_mod._target_epsilon(out) == 3.0


def test_plot_of_a_real_run(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    res, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, training={"steps": 3})
    assert res.exit_code == 0, res.output
    result = plot_mod.plot_run(out)
    steps = [json.loads(line) for line in (tmp_path / "run.private" / "metrics.jsonl").read_text().splitlines()]
    steps = [e for e in steps if "step" in e]
    assert result.series.steps == [1, 2, 3] == [e["step"] for e in steps]
    assert result.series.epsilon == [e["epsilon_upper"] for e in steps] and result.series.epsilon[-1] <= 8.0
    assert result.series.loss == [e["not_covered_by_dp"]["train_loss"] for e in steps]
    assert not (out / "training.png").exists() and (tmp_path / "run.private" / "training.png").is_file()
