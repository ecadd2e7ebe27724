"""``dplora audit`` states its power (issue 46 item 2, issue 49) on the tiny model: the ε̂ ceiling of its (m, r),
"uninformative" below 1,000 canaries, TPR against the attack ceiling, and the power check on public data only."""

from __future__ import annotations

import json

from conftest import contract_dict, write_contract
from typer.testing import CliRunner

from dplora.accounting.ceiling import attack_ceiling
from dplora.accounting.events import DpSgdEvent
from dplora.audit import bound
from dplora.cli.app import app

runner = CliRunner()
ARGS = ["--canaries", "12", "--candidates", "20", "--no-progress", "--threads", "1"]


def test_power_check_is_refused_on_private_data_before_training(tmp_path, tiny_model_dir, tickets_csv):
    cfg = write_contract(tmp_path / "a.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp_path / "o"))
    result = runner.invoke(app, ["audit", str(cfg), *ARGS, "--power-check"])
    assert result.exit_code == 2 and "never on the private data" in result.output
    assert not (tmp_path / "o-audit" / "run").exists()
    same = runner.invoke(app, ["audit", str(cfg), *ARGS, "--power-check", "--power-data", str(tickets_csv)])
    assert same.exit_code == 2 and "private data file" in same.output
    alone = runner.invoke(app, ["audit", str(cfg), *ARGS, "--power-data", str(tickets_csv)])
    assert alone.exit_code == 2 and "give --power-check too" in alone.output


def test_small_audit_is_uninformative_states_its_ceilings_and_runs_the_power_check(
    tmp_path, tiny_model_dir, tickets_csv
):
    cfg = write_contract(tmp_path / "a.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp_path / "o"))
    result = runner.invoke(app, ["audit", str(cfg), *ARGS, "--data-source", "surrogate", "--power-check"])
    assert result.exit_code in (0, 5), result.output
    report = json.loads((tmp_path / "o-audit" / "audit.json").read_text())
    assert report["epsilon_lower_bound_ceiling"] == bound.epsilon_lower_bound(m=12, r=6, v=6, delta=1e-5)
    assert not report["informative"] and "12 canaries, fewer than 1000" in report["uninformative_reasons"][0]
    if not report["violation"]:
        assert report["verdict"] == "uninformative" and "uninformative" in result.output
    plan = report["mechanism"]
    event = DpSgdEvent(sample_rate=plan["sample_rate"], noise_multiplier=plan["noise_multiplier"], steps=plan["steps"])
    ceiling = attack_ceiling(event)
    points = report["tpr_vs_ceiling"]
    assert [p["fpr"] for p in points] == [0.001, 0.01, 0.1]
    assert [p["ceiling"] for p in points] == list(ceiling.tprs)
    assert all(p["exceeded"] == (p["tpr_lower"] > p["ceiling_at_fpr_upper"]) for p in points)
    check = report["power_check"]
    assert (
        check["data_source"] == "surrogate"
        and check["epsilon_lower_bound_ceiling"] == (report["epsilon_lower_bound_ceiling"])
    )
    assert 0.0 <= check["fraction_of_ceiling"] <= 1.0
    statement = (tmp_path / "o-audit" / "power-run" / "release.dsse.json").read_text()
    assert "NOT DIFFERENTIALLY PRIVATE" in __import__("base64").b64decode(json.loads(statement)["payload"]).decode()
    assert "power check" in result.output and not (tmp_path / "o-audit" / "power-run.key").exists()
