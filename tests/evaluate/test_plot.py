"""Issue 42.9: ``dplora plot RUN`` draws loss, ε and step time from ``<run>.private/metrics.jsonl`` into a PRIVATE
PNG inside ``<run>.private/``."""

from __future__ import annotations

import sys

import pytest
from support.plot import fake_run, run

from dplora.errors import BadInputError
from dplora.evaluate import plot as plot_mod


def test_plot_errors_are_one_line(tmp_path, monkeypatch):
    res = run("plot", tmp_path / "nothing")
    assert res.exit_code == 2 and "no such run folder or contract file" in res.output
    (tmp_path / "bare").mkdir()
    res = run("plot", tmp_path / "bare")
    assert res.exit_code == 2 and "no private folder" in res.output
    out = fake_run(tmp_path, [])
    res = run("plot", out)
    assert res.exit_code == 2 and "has no training steps to plot" in res.output
    assert len([line for line in res.output.splitlines() if line.strip()]) == 1
    (tmp_path / "run.private" / "metrics.jsonl").write_text('{"step": 1}\n{not json\n')
    with pytest.raises(BadInputError, match="line 2 is not JSON"):
        plot_mod.plot_run(out)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    res = run("plot", out)
    assert res.exit_code == 2 and "dplora plot needs matplotlib: pip install matplotlib" in res.output
