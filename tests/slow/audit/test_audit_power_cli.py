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


def test_power_data_copy_of_the_private_file_exits_alike_under_d_and_its_neighbour(
    tmp_path, tiny_model_dir, tickets_csv, monkeypatch
):
    """--power-data is compared with the private file by path and file identity, never by content: a byte copy of D
    passes the refusal point under D and under D' (D without its last record) alike, so the exit code says nothing
    about whether the private file equals the copy. Training is stubbed: the refusal point is what differed."""
    import shutil

    import typer

    lines = tickets_csv.read_text().splitlines(keepends=True)
    neighbour = tmp_path / "neighbour.csv"
    neighbour.write_text("".join(lines[:-1]))
    copy = tmp_path / "public.csv"
    shutil.copyfile(tickets_csv, copy)
    reached: list = []

    def stub(contract, options, **kwargs):
        reached.append((contract.data.path, kwargs["power_contract"].data.path, kwargs["power_source"].value))
        raise typer.Exit(0)

    monkeypatch.setattr("dplora.audit.runner.run_audit", stub)
    codes = []
    for name, data in (("d", tickets_csv), ("d-prime", neighbour)):
        cfg = write_contract(tmp_path / f"{name}.yaml", contract_dict(tiny_model_dir, data, tmp_path / name))
        result = runner.invoke(app, ["audit", str(cfg), *ARGS, "--power-check", "--power-data", str(copy)])
        codes.append(result.exit_code)
        assert "private data file" not in result.output, result.output
    assert codes == [0, 0]
    assert reached == [
        (str(tickets_csv), str(copy.resolve()), "public"),
        (str(neighbour), str(copy.resolve()), "public"),
    ]


def test_power_check_line_says_a_copy_declared_public_voids_the_guarantee():
    from dplora.audit.runner import POWER_DATA_NOTE
    from dplora.audit.summary import power_check_lines

    check = {
        "data_source": "public",
        "data_note": POWER_DATA_NOTE,
        "epsilon_lower_bound": 0.5,
        "epsilon_lower_bound_ceiling": 1.0,
        "fraction_of_ceiling": 0.5,
        "correct": 3,
        "guesses": 4,
        "mia_auc": 0.75,
    }
    (line,) = power_check_lines({"power_check": check})
    assert line.endswith(
        "MIA AUC 0.750; its data: declared public by the caller; dplora refuses only the private file itself (same "
        "path or file) and never compares contents: a copy of private data declared public voids the guarantee (this "
        "run has no noise, and its numbers are in this report and in any release it is attached to)"
    ), line
    (surrogate,) = power_check_lines({"power_check": {**check, "data_source": "surrogate", "data_note": None}})
    assert "voids" not in surrogate


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
