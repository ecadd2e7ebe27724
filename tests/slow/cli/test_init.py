"""The slow tier of tests/cli/test_init.py, whose docstring describes the module."""

from __future__ import annotations

import json

from support.init import filled, run
from typer.testing import CliRunner

from dplora.cli.app import app


def test_an_init_contract_plans_with_the_planner_once_declared(tmp_path, monkeypatch):
    from dplora.data.demo import write_tickets

    monkeypatch.chdir(tmp_path)
    write_tickets(tmp_path / "t.jsonl", num_tickets=40, seed=0, record_format="messages")
    assert run("init", "t.jsonl", "smollm2-135m", "--out", "c.yaml").exit_code == 0
    filled(tmp_path / "c.yaml", n=1000)
    res = CliRunner().invoke(app, ["budget", "c.yaml", "privacy.accountant=rdp", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    # the rule's brute force for N=1000, ε=8, δ=1e-5, RDP (tests/plan/test_planner.py): B=48, T=ceil(3000/48)=63
    assert report["num_units"] == 1000 and (report["expected_batch_size"], report["steps"]) == (48, 63)
