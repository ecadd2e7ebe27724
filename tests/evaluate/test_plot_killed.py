"""``dplora plot`` on a run that was killed or failed: its steps are in ``<run>.partial/private/metrics.jsonl`` (no
release, no ``<run>.private``), and the figure goes beside them; with no metrics anywhere, one line and exit 2."""

from __future__ import annotations

import json

from conftest import contract_dict, write_contract
from typer.testing import CliRunner

from dplora.cli.app import app


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _entry(step, eps, seconds, loss):
    return {"step": step, "epsilon_upper": eps, "seconds": seconds, "not_covered_by_dp": {"train_loss": loss}}


def test_plot_of_a_killed_runs_partial_folder(tmp_path):
    private = tmp_path / "run.partial" / "private"
    private.mkdir(parents=True)
    lines = [{"note": "header"}, _entry(1, 0.5, 2.0, 3.0), _entry(2, 0.9, 2.5, 2.75)]
    (private / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    for target in (tmp_path / "run", tmp_path / "run.partial"):
        res = run("plot", target)
        assert res.exit_code == 0, res.output
        assert f"wrote {private / 'training.png'} (2 steps): PRIVATE" in res.stdout
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.private").exists()


def test_plot_without_metrics_is_one_line(tmp_path):
    (tmp_path / "run.partial").mkdir()  # killed before its first step
    res = run("plot", tmp_path / "run")
    assert res.exit_code == 2
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no private folder ") and "at least one step" in lines[0]


def test_plot_of_a_real_run_that_failed_at_step_two(tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key):
    import torch

    calls = []
    step = torch.optim.AdamW.step

    def fail_second(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected fault")
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", fail_second)
    out = tmp_path / "run"
    cfg = write_contract(tmp_path / "c.yaml", contract_dict(tiny_model_dir, tickets_csv, out))
    result = run("train", cfg, "--signing-key", signing_key[0], "--no-progress")
    assert result.exit_code == 4, result.output
    assert not out.exists()
    res = run("plot", cfg)  # the contract names the output folder, which the run never published
    assert res.exit_code == 0, res.output
    assert "(1 steps): PRIVATE" in res.stdout
    assert (tmp_path / "run.partial" / "private" / "training.png").is_file()
