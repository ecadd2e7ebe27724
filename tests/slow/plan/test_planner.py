"""The slow tier of tests/plan/test_planner.py, whose docstring describes the module."""

from __future__ import annotations

import json
import math

import pytest
from conftest import contract_dict, write_contract
from support.planner import ARGS, auto
from typer.testing import CliRunner

from dplora.accounting.calibration import calibrate
from dplora.accounting.checked import checked_curve, numerical_chain
from dplora.accounting.cost import tolerance_for
from dplora.accounting.events import DpSgdEvent
from dplora.contract.loader import parse_contract
from dplora.plan.planner import MIN_STEPS, batch_options, recommend


def test_choice_is_the_rules_brute_force():
    rec = recommend(**ARGS, lr_ref=2e-3)
    rows = []
    for b in batch_options(1000):
        t = math.ceil(3 * 1000 / b)
        if t < MIN_STEPS:
            continue
        sigma, _ = calibrate(
            target_epsilon=8.0, sample_rate=b / 1000, steps=t, delta=1e-5, accountant="rdp", adjacency="add_remove"
        )
        rows.append((sigma / b, -t, b, t, sigma))
    best = min(rows)
    assert (rec.choice.expected_batch_size, rec.choice.steps) == (best[2], best[3]) == (48, 63)
    assert rec.choice.noise_multiplier == pytest.approx(best[4])
    assert rec.choice.lr == pytest.approx(2e-3 * math.sqrt(48 / 32))
    assert [c.expected_batch_size for c in rec.candidates] == [32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1000]
    assert [c.steps for c in rec.candidates] == [94, 63, 47, 32, 24, 16, 12, 8, 6, 4, 3]
    assert [c.expected_batch_size for c in rec.candidates if c.noise_multiplier is not None] == [48]  # the front
    assert rec.warmup_steps == 0 and rec.lr_schedule == "constant"


def test_max_steps_caps_t_and_changes_the_choice():
    rec = recommend(**ARGS, lr_ref=2e-3, max_steps=60)
    assert all(c.steps <= 60 for c in rec.candidates)
    assert (rec.choice.expected_batch_size, rec.choice.steps) == (48, 60)


def test_every_candidate_within_target_same_accountant_integer_t():
    for accountant in ("rdp", "prv"):
        rec = recommend(**(ARGS | {"accountant": accountant}), lr_ref=1e-3, epochs=2)
        eligible = [c for c in rec.candidates if c.excluded is None]
        assert eligible
        chain = numerical_chain(accountant, "add_remove")
        for c in eligible:
            assert isinstance(c.steps, int)
            event = DpSgdEvent(sample_rate=c.sample_rate, noise_multiplier=c.noise_multiplier, steps=c.steps)
            eps = checked_curve(event, 1e-5, chain, [c.steps], tolerance_for(8.0)).epsilons[-1]
            assert eps <= 8.0


def test_planner_never_reads_data_and_ignores_private_counts(tmp_path, tiny_model_dir):
    """Two data files with different records per unit (same declared N) and a missing file: one choice."""
    from dplora.plan.resolve import resolve_auto

    rows_a = "customer_id,message,reply\n" + "".join(f"c{i},m{i},r{i}\n" for i in range(40))
    rows_b = "customer_id,message,reply\n" + "".join(f"c{i % 5},m{i},r{i}\n" for i in range(90))
    (tmp_path / "a.csv").write_text(rows_a)
    (tmp_path / "b.csv").write_text(rows_b)
    out = []
    for name in ("a.csv", "b.csv", "missing.csv"):
        raw = auto(tmp_path, tiny_model_dir, tmp_path / name, epochs=3)
        raw["privacy"].update({"protected_unit": "user", "unit_key": "customer_id", "max_records_per_unit": 4})
        resolved, rec = resolve_auto(parse_contract(raw))
        out.append((resolved.training.model_dump(mode="json"), rec.to_dict()))
    assert out[0] == out[1] == out[2]
    assert out[0][0]["expected_batch_size"] == 48 and out[0][0]["steps"] == 50


def test_budget_recommend_cli_without_data(tmp_path, tiny_model_dir):
    from dplora.cli.app import app

    raw = contract_dict(tiny_model_dir, tmp_path / "missing.csv", tmp_path / "out", privacy={"num_units": 1000})
    cfg = write_contract(tmp_path / "c.yaml", raw)
    res = CliRunner().invoke(app, ["budget", str(cfg), "--recommend", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert (report["expected_batch_size"], report["steps"]) == (48, 63)
    assert report["recommendation"]["choice"]["expected_batch_size"] == 48
    assert report["epsilon"] <= 8.0 and "not_covered_by_dp" not in report
    res = CliRunner().invoke(app, ["budget", str(cfg), "--recommend", "--max-steps", "60", "--json"])
    assert json.loads(res.stdout)["steps"] == 60
    del raw["privacy"]["num_units"]
    cfg = write_contract(tmp_path / "c2.yaml", raw)
    res = CliRunner().invoke(app, ["budget", str(cfg), "--recommend"])
    assert res.exit_code == 2 and "num_units" in res.output


def test_auto_contract_trains_and_records_the_choice(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    from conftest import release_statement, train_tiny

    res, out = train_tiny(
        tmp_path,
        tiny_model_dir,
        tickets_csv,
        signing_key,
        privacy={"num_units": 800, "clipping": "normalize"},
        training={"expected_batch_size": "auto", "steps": 50, "epochs": 3},
    )
    assert res.exit_code == 0, res.output
    record = release_statement(out)["predicate"]
    assert record["accounting"]["steps_planned"] == 50
    assert record["mechanism"]["clipping"] == "normalize"
    assert record["mechanism"]["normalize_gamma"] == pytest.approx(0.01)
    opt = record["optimization"]
    assert opt["planner"]["choice"]["expected_batch_size"] == 48 and opt["lr_schedule"] == "constant"
    assert record["accounting"]["epsilon_spent"] <= 8.0
    from dplora.cli.app import app

    verify = CliRunner().invoke(app, ["verify", str(out), "--public-key", str(signing_key[1])])
    assert verify.exit_code == 0, verify.output
