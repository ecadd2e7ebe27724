"""The planner's reach: small teams plan from `init`, the noise–compute table is calibrated tightly, and a time
budget is an operator tool that reads public inputs only."""

from __future__ import annotations

import json
import math

import pytest
from conftest import contract_dict, write_contract
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.plan import estimate
from dplora.plan.estimate import EstimateInputs, epochs_for_time, parse_duration
from dplora.plan.planner import recommend


def _init_and_budget(tmp_path, monkeypatch, n: int) -> dict:
    """`dplora init` on a small jsonl file, N/ε/δ filled in as a user would, then `budget --json`."""
    monkeypatch.chdir(tmp_path)
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(n)]  # fmt: skip
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert CliRunner().invoke(app, ["init", "d.jsonl", "smollm2-135m", "--out", "c.yaml"]).exit_code == 0
    text = (tmp_path / "c.yaml").read_text()
    for key, value in (("num_units", str(n)), ("target_epsilon", "8"), ("delta", f"{1 / (10 * n):.3g}")):
        text = text.replace(f"{key}: DECLARE", f"{key}: {value}", 1)
    (tmp_path / "c.yaml").write_text(text)
    res = CliRunner().invoke(app, ["budget", "c.yaml", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.parametrize("n", [50, 100, 534, 5000])
def test_init_then_budget_plans_for_every_declared_n_from_50(tmp_path, monkeypatch, n):
    report = _init_and_budget(tmp_path, monkeypatch, n)
    rec = report["recommendation"]
    assert report["num_units"] == n and report["epsilon"] <= 8.0
    assert rec["inputs"]["epochs"] == 3
    assert rec["inputs"]["min_steps"] == min(50, math.ceil(3 * n / 32))
    assert report["steps"] >= rec["inputs"]["min_steps"] and report["expected_batch_size"] <= n
    # init writes lr: auto; chat records are generated replies: the task's reference rate, scaled by √(B/32)
    assert rec["inputs"]["lr_ref"] == 0.006 and rec["inputs"]["lr_ref_source"] == "data.task=generation"
    assert report["lr"] == pytest.approx(0.006 * math.sqrt(report["expected_batch_size"] / 32), rel=1e-12)


def test_q_one_candidate_at_n_554_is_the_gaussian_mechanism_with_its_exact_ceiling():
    from dplora.accounting.ceiling import gaussian_tprs
    from dplora.accounting.events import DpSgdEvent

    rec = recommend(
        num_units=554, target_epsilon=8.0, delta=1e-5, accountant="pld", adjacency="add_remove", lr_ref=2e-3,
        epochs=50,
    )  # fmt: skip
    full = next(c for c in rec.candidates if c.sample_rate == 1.0)
    assert full.excluded is None and full.steps == 50
    event = DpSgdEvent(sample_rate=1.0, noise_multiplier=full.noise_multiplier, steps=50)
    (tpr,) = gaussian_tprs(event, (0.01,))
    assert 0.01 < tpr < 1.0


@pytest.mark.parametrize("text", ["0", "-1", "45", "abc", "0m", "1y", "", "2h-5m"])
def test_a_bad_time_budget_is_one_line(text):
    from dplora.errors import BadInputError

    with pytest.raises(BadInputError, match="--time-budget"):
        parse_duration(text)


@pytest.mark.parametrize(("text", "seconds"), [("45m", 2700), ("2h", 7200), ("1h30m", 5400), ("90s", 90)])
def test_time_budget_units(text, seconds):
    assert parse_duration(text) == seconds


def _inputs(seconds: float = 2.0) -> EstimateInputs:
    return EstimateInputs(steps=1, expected_batch_size=32, records_per_unit=1, records_basis="row", world_size=1,
                          physical_batch=8, max_seq_len=64, probe_seconds=seconds, device="cpu")  # fmt: skip


def test_epochs_for_time_is_rounded_down_and_refuses_under_a_tenth_of_an_epoch():
    doc = epochs_for_time(_inputs(2.0), 1000, 3600)  # one epoch = 125 forwards × 2 s = 250 s
    assert doc["epoch_seconds"] == 250 and doc["epochs"] == 14.4  # 3600 / 250 = 14.4
    from dplora.errors import BadInputError

    with pytest.raises(BadInputError, match="shorter than a tenth of an epoch"):
        epochs_for_time(_inputs(2.0), 1000, 20)


def test_budget_with_a_time_budget_is_the_same_on_neighbouring_datasets(tmp_path, tiny_model_dir, monkeypatch):
    """D and D' (one record fewer) with the probe injected: the whole `budget --json` report is identical, and the
    planner spends the epochs the budget allows."""
    from dplora.recipe import build

    monkeypatch.setattr(build, "estimate_without_data", lambda *a, **k: _inputs(2.0))
    monkeypatch.setenv("CI", "true")
    reports = []
    for name, rows in (("d.csv", 40), ("d2.csv", 39)):
        data = tmp_path / name
        data.write_text("message,reply\n" + "".join(f"m{i},r{i}\n" for i in range(rows)))
        raw = contract_dict(tiny_model_dir, data, tmp_path / "out", privacy={"num_units": 1000})
        raw["training"].pop("steps")
        raw["training"].update({"expected_batch_size": "auto", "epochs": "auto", "max_epochs": 50})
        cfg = write_contract(tmp_path / f"{name}.yaml", raw)
        res = CliRunner().invoke(app, ["budget", str(cfg), "--json", "--time-budget", "1h"])
        assert res.exit_code == 0, res.output
        reports.append(json.loads(res.stdout))
    assert reports[0] == reports[1]
    tb = reports[0]["time_budget"]
    assert tb["epochs"] == 14.4 and tb["used_by_planner"] is True
    assert reports[0]["recommendation"]["inputs"]["max_epochs"] == 14.4
    assert max(c["epochs"] for c in reports[0]["recommendation"]["candidates"]) == 14.4


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"epochs": "auto"}, "needs training.max_epochs"),
        ({"epochs": "auto", "max_epochs": 0.5}, "max_epochs"),
        ({"epochs": 3, "max_epochs": 20}, "caps training.epochs: auto"),
        ({"expected_batch_size": 8, "epochs": "auto", "max_epochs": 20}, "needs training.expected_batch_size: auto"),
        ({"expected_batch_size": 8, "epochs": 3, "lr": "auto"}, "training.lr: auto needs"),
        ({"epochs": 3, "lr": "fast"}, "training.lr='fast': must be a number (no quotes), or 'auto'"),
        ({"epochs": 3, "lr": "Auto"}, "or 'auto'"),
        ({"epochs": 3, "lr": 0}, "training.lr=0: must be > 0"),
        ({"epochs": 3, "lr": True}, "training.lr=true: must be a number (no quotes), or 'auto' (YAML reads"),
        ({"epochs": 3, "lr": "auto", "optimizer": "sgd"}, "rate measured for AdamW and Adam; with"),
        ({"epochs": 3, "lr": "auto", "optimizer": "dp_adambc"}, "training.optimizer=dp_adambc give the rate"),
    ],
)
def test_new_epoch_keys_bad_input_is_one_line_exit_2(tmp_path, tiny_model_dir, training, message):
    raw = contract_dict(tiny_model_dir, tmp_path / "missing.csv", tmp_path / "out", privacy={"num_units": 1000})
    raw["training"].pop("steps")
    raw["training"].update({"expected_batch_size": "auto"} | training)
    cfg = write_contract(tmp_path / "c.yaml", raw)
    res = CliRunner().invoke(app, ["validate", str(cfg)])
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], res.output


def test_time_budget_reads_no_private_count(monkeypatch):
    """epochs_for_time's inputs are public by construction: EstimateInputs carries no table, index or token."""
    assert set(estimate.EstimateInputs.__dataclass_fields__) == {
        "steps", "expected_batch_size", "records_per_unit", "records_basis", "world_size", "physical_batch",
        "max_seq_len", "probe_seconds", "device",
    }  # fmt: skip


def test_the_recorded_rule_is_the_documented_one():
    from pathlib import Path

    from dplora.plan.planner import RULE

    doc = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text(encoding="utf-8")
    assert f"```text\n{RULE}\n```" in doc


@pytest.mark.parametrize(("q", "sigma", "steps"), [(0.384, 1.8772, 53), (0.5, 2.0, 40), (0.8, 2.5, 30)])
def test_prv_at_the_large_q_the_planner_reaches_agrees_with_dp_accountings_pld(q, sigma, steps):
    """scipy warns on the PRV's mean integral at large q (silenced in the backend): the ε it gives there stays
    within 0.05 of dp_accounting's PLD (interval 1e-4), so the warning marks no numerical failure."""
    import warnings

    import dp_accounting

    from dplora.accounting.backends import prv_epsilon
    from dplora.accounting.events import DpSgdEvent

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the backend itself must not let the warning through
        prv = prv_epsilon(DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps), 1e-5)
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    assert abs(prv - acc.get_epsilon(1e-5)) <= 0.05


@pytest.mark.parametrize(("task", "lr_ref"), [("generation", 0.006), ("classification", 0.002)])
def test_lr_auto_is_the_declared_tasks_reference_rate(tmp_path, tiny_model_dir, task, lr_ref):
    """training.lr: auto resolves to the task's rate at B = 32, scaled like a number; the plan says where it came
    from, and a number in training.lr is still used as given."""
    from dplora.contract.loader import parse_contract
    from dplora.plan.planner import TASK_REFERENCE_LR
    from dplora.plan.resolve import resolve_auto

    assert TASK_REFERENCE_LR[task] == lr_ref
    extra = {"task": task, "labels": ["a", "b"]} if task == "classification" else {}
    raw = contract_dict(tiny_model_dir, tmp_path / "missing.csv", tmp_path / "out", privacy={"num_units": 1600})
    raw["data"].update(extra)
    raw["training"].pop("steps")
    raw["training"].update({"expected_batch_size": "auto", "epochs": 3, "lr": "auto"})
    resolved, rec = resolve_auto(parse_contract(raw))
    batch = resolved.training.expected_batch_size
    assert resolved.training.lr == pytest.approx(lr_ref * math.sqrt(batch / 32), rel=1e-12)
    assert rec.to_dict()["inputs"]["lr_ref"] == lr_ref
    assert rec.to_dict()["inputs"]["lr_ref_source"] == f"data.task={task}"
    assert all(c.lr == pytest.approx(lr_ref * math.sqrt(c.expected_batch_size / 32)) for c in rec.candidates)
    raw["training"]["lr"] = 0.004
    resolved, rec = resolve_auto(parse_contract(raw))
    assert resolved.training.lr == pytest.approx(0.004 * math.sqrt(batch / 32), rel=1e-12)
    assert rec.to_dict()["inputs"]["lr_ref_source"] == "training.lr"
    del raw["training"]["lr"]  # absent: the default of every contract before lr: auto, whatever the task
    resolved, rec = resolve_auto(parse_contract(raw))
    assert resolved.training.lr == pytest.approx(0.002 * math.sqrt(batch / 32), rel=1e-12)
    assert rec.to_dict()["inputs"]["lr_ref_source"] == "training.lr (absent: the default)"
    cfg = write_contract(tmp_path / "absent.yaml", raw)  # the text view names the task rule only under lr: auto
    res = CliRunner().invoke(app, ["budget", str(cfg), "--recommend"])
    assert res.exit_code == 0, res.output
    assert not [line for line in res.output.splitlines() if line.startswith("lr_ref:")]
    raw["training"]["lr"] = "auto"
    res = CliRunner().invoke(app, ["budget", str(write_contract(tmp_path / "auto.yaml", raw)), "--recommend"])
    assert f"lr_ref: {lr_ref:g} at B = 32, the rate for data.task={task} (training.lr: auto" in res.output


def test_lr_auto_is_the_same_on_neighbouring_datasets(tmp_path, tiny_model_dir, monkeypatch):
    """D and D' (one record fewer, other lengths and words) under lr: auto: the whole `budget --json` report is
    identical: the rate reads the declared task, never the data."""
    monkeypatch.setenv("CI", "true")
    reports = []
    for name, rows, word in (("d.csv", 40, "refund"), ("d2.csv", 39, "a much longer reply about a card")):
        data = tmp_path / name
        data.write_text("message,reply\n" + "".join(f"m{i},{word} {i}\n" for i in range(rows)))
        raw = contract_dict(tiny_model_dir, data, tmp_path / "out", privacy={"num_units": 1000})
        raw["training"].pop("steps")
        raw["training"].update({"expected_batch_size": "auto", "epochs": 3, "lr": "auto"})
        cfg = write_contract(tmp_path / f"{name}.yaml", raw)
        res = CliRunner().invoke(app, ["budget", str(cfg), "--json"])
        assert res.exit_code == 0, res.output
        reports.append(json.loads(res.stdout))
    assert reports[0] == reports[1]
    assert reports[0]["recommendation"]["inputs"]["lr_ref"] == 0.006


def test_recommend_on_a_fixed_b_contract_refuses_a_rate_the_planner_would_scale_past_the_bound(
    tmp_path, tiny_model_dir
):
    """--recommend reads a fixed-B contract's lr as the rate at B = 32: 5·sqrt(2048/32) = 40 is past the bound of
    10, so one line and exit 2 from the contract, not a validation error of the resolved rate."""
    raw = contract_dict(tiny_model_dir, tmp_path / "missing.csv", tmp_path / "out", privacy={"num_units": 50000})
    raw["training"].update({"expected_batch_size": 16, "steps": 100, "lr": 5.0})
    cfg = write_contract(tmp_path / "c.yaml", raw)
    res = CliRunner().invoke(app, ["budget", str(cfg), "--recommend"])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "training.lr=5.0: the planner reads it as the rate at B = 32" in lines[0]
    assert "at most 0.625" in lines[0]
