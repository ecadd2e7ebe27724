"""The slow tier of tests/run/test_outputs.py, whose docstring describes the module."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import contract_dict, train_contract, write_contract
from support.outputs import runner, workdir

from dplora.cli.app import app


def test_overwrite_replaces_a_previous_run_and_nothing_else(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """A previous run is replaced (exit 0, the new release verifies); one with a foreign file is refused."""
    work = workdir(tmp_path, monkeypatch, tickets_csv, signing_key)
    cfg = write_contract(work / "c.yaml", contract_dict(tiny_model_dir, work / "tickets.csv", Path("run")))
    assert train_contract(cfg, "signing.key").exit_code == 0
    first = json.loads((work / "run" / "release.dsse.json").read_text())
    (work / "run" / "mine.txt").write_text("keep")
    refused = train_contract(cfg, "signing.key", "--overwrite")
    assert refused.exit_code == 2 and "also holds 'mine.txt'" in refused.output
    (work / "run" / "mine.txt").unlink()
    again = train_contract(cfg, "signing.key", "--overwrite")
    assert again.exit_code == 0, again.output
    assert json.loads((work / "run" / "release.dsse.json").read_text()) != first
    names = ["c.yaml", "run", "run.private", "signing.key", "signing.pub", "tickets.csv"]  # one private folder
    assert sorted(p.name for p in work.iterdir()) == names
    check = runner.invoke(app, ["verify", "run", "--public-key", "signing.pub"])
    assert check.exit_code == 0, check.output
