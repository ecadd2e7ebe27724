"""Issue 42.7: the time estimate before step 1 is public by construction: the plan's public numbers, public contract
keys and a timed synthetic step; never a count of the private data."""

from __future__ import annotations

import dataclasses
import inspect
import re
import types

import pytest
import torch
from conftest import train_tiny

from dplora.engine import membatch
from dplora.plan import estimate as est
from dplora.run import loop

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


def _inputs(**kw):
    base = {
        "steps": 20,
        "expected_batch_size": 32.0,
        "records_per_unit": 1,
        "records_basis": "row",
        "world_size": 1,
        "physical_batch": 8,
        "max_seq_len": 64,
        "probe_seconds": 0.5,
        "device": "cpu",
    }
    return est.EstimateInputs(**(base | kw))


@pytest.mark.parametrize(
    ("kw", "forwards", "seconds"),
    [
        ({}, 4, 40.0),  # 20 steps × ⌈32/8⌉ × 0.5 s
        ({"expected_batch_size": 33.0}, 5, 50.0),  # ⌈33/8⌉ = 5
        ({"expected_batch_size": 8.0, "records_per_unit": 3, "records_basis": "cap"}, 3, 30.0),
        ({"world_size": 2}, 2, 20.0),  # each process runs half the expected units
        ({"expected_batch_size": 2.0}, 1, 10.0),  # at least one forward per step
        ({"steps": 0}, 4, 0.0),
    ],
)
def test_the_estimate_is_t_times_forwards_times_the_probe(kw, forwards, seconds):
    inputs = _inputs(**kw)
    assert est.forwards_per_step(inputs) == forwards
    assert est.estimate_seconds(inputs) == pytest.approx(seconds)
    assert est.estimate_doc(inputs)["seconds"] == pytest.approx(seconds)


def test_duration_text():
    assert [est.duration_text(s) for s in (40, 89, 600, 5340, 5400, 12000)] == [
        "40 s", "89 s", "10 min", "89 min", "1 h 30 min", "3 h 20 min",
    ]  # fmt: skip


def test_the_inputs_function_takes_no_data():
    """Its parameters are the contract, the plan and probe facts: no table, unit index, examples or counts."""
    assert list(inspect.signature(est.estimate_inputs).parameters) == [
        "contract", "plan", "physical_batch", "probe_seconds", "device", "world_size", "done_steps",
    ]  # fmt: skip
    contract = types.SimpleNamespace(
        privacy=types.SimpleNamespace(max_records_per_unit=None, protected_unit="row"),
        training=types.SimpleNamespace(max_seq_len=48),
    )
    plan = types.SimpleNamespace(steps=5, expected_batch_size=8)
    got = est.estimate_inputs(contract, plan, physical_batch=4, probe_seconds=0.2, device="cpu", done_steps=2)
    assert got == _inputs(steps=3, expected_batch_size=8.0, physical_batch=4, max_seq_len=48, probe_seconds=0.2)
    contract.privacy.protected_unit = "user"
    got = est.estimate_inputs(contract, plan, physical_batch=4, probe_seconds=0.2, device="cpu")
    assert (got.records_per_unit, got.records_basis) == (1, "assumed")
    assert "1 record per unit assumed (a unit's record count is private" in est.estimate_line(got)
    contract.privacy.max_records_per_unit = 5
    got = est.estimate_inputs(contract, plan, physical_batch=4, probe_seconds=0.2, device="cpu")
    assert (got.records_per_unit, got.records_basis, est.forwards_per_step(got)) == (5, "cap", 10)  # ⌈8·5/4⌉


def test_the_probe_is_synthetic_and_leaves_no_gradient(monkeypatch):
    from peft import LoraConfig, get_peft_model
    from tiny import tiny_llama

    from dplora.engine import batch as batching
    from dplora.mechanism import optimizer as dpopt

    model = get_peft_model(tiny_llama(seed=0), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    plan = types.SimpleNamespace(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=2.0, sample_rate=0.5,
                                 steps=3, target_epsilon=10.0)  # fmt: skip
    gsm, dp_opt, _ = dpopt.make_private(model, torch.optim.SGD([p for _, p in named], lr=0.1), plan=plan,
                                         unit_mean=False, per_sample="fast")  # fmt: skip
    seen = []
    monkeypatch.setattr(membatch, "collate", lambda records, pad, device: seen.append(records) or
                        batching.collate(records, pad, device=device))  # fmt: skip
    seconds = membatch.time_synthetic_step(gsm, dp_opt, named, batch_size=3, max_seq_len=16, pad_id=256,
                                           device=torch.device("cpu"))  # fmt: skip
    assert seconds is not None and seconds > 0
    assert seen == [[([1] * 16, [1] * 16)] * 3] * 2  # warm-up and timed run: three records of token 1, 16 tokens
    assert all(p.grad is None and getattr(p, "grad_sample", None) is None for _, p in named)


def _neighbours(tmp_path):
    from dplora.data.demo import write_tickets

    full = tmp_path / "full.csv"
    write_tickets(full, num_tickets=60, seed=3)
    lines = full.read_text().splitlines(keepends=True)
    less = tmp_path / "less.csv"
    less.write_text("".join(lines[:5] + lines[6:]))  # one row (one unit at row level) removed
    return full, less


def test_train_prints_the_same_estimate_on_neighbouring_datasets_before_step_1(
    tmp_path, tiny_model_dir, signing_key, monkeypatch
):
    from dplora.recipe import build

    captured = []
    real = est.estimate_inputs

    order = []
    real_step = loop.logical_step

    def spy(*args, **kwargs):
        captured.append((args, kwargs))
        order.append("estimate")
        return real(*args, **kwargs)

    def step(*args, **kwargs):
        order.append("step")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(loop, "logical_step", step)

    monkeypatch.setattr(est, "estimate_inputs", spy)
    monkeypatch.setattr(membatch, "time_synthetic_step", lambda *a, **k: 0.25)  # a fixed clock: compare the rest
    lines = []
    for name, path in zip(("a", "b"), _neighbours(tmp_path), strict=True):
        res, _ = train_tiny(tmp_path, tiny_model_dir, path, signing_key, name=name,
                            privacy={"num_units": 60}, training={"steps": 3, "expected_batch_size": 8})  # fmt: skip
        assert res.exit_code == 0, res.output
        found = [line for line in res.output.splitlines() if line.startswith("estimate:")]
        assert len(found) == 1
        lines.append(found[0])
        out = res.output
        assert out.index("device:") < out.index("estimate:") < out.index("done: 3/3 steps")
    assert order == ["estimate", "step", "step", "step", "estimate", "step", "step", "step"]  # before step 1
    assert lines[0] == lines[1]
    # T=3, B=8, P=4 (contract_dict's physical batch): ⌈8/4⌉ = 2 forwards × 0.25 s = 0.5 s/step, 1.5 s in all
    assert re.search(
        r"about 2 s for 3 steps \(0\.5 s/step: 2 forward\(s\) of 4 synthetic records × 48 tokens", lines[0]
    )
    (a_args, a_kw), (b_args, b_kw) = captured
    assert a_kw == b_kw and a_kw["probe_seconds"] == 0.25
    ia, ib = real(*a_args, **a_kw), real(*b_args, **b_kw)
    assert dataclasses.asdict(ia) == dataclasses.asdict(ib)
    # what the contract and plan contribute is public: the output folders differ, nothing read from data
    assert (a_args[1].steps, a_args[1].expected_batch_size, a_args[1].num_units) == (3, 8, 60)
    assert (b_args[1].steps, b_args[1].expected_batch_size, b_args[1].num_units) == (3, 8, 60)
    assert build.probe_estimate.__code__.co_varnames[:5] == ("contract", "plan", "model", "optimizer", "named")


def _budget_contract(tmp_path, tiny_model_dir, tickets_csv, **privacy):
    from conftest import contract_dict, write_contract

    raw = contract_dict(tiny_model_dir, tickets_csv, tmp_path / "out", privacy={"accountant": "rdp", **privacy})
    raw["training"] |= {"steps": 3, "expected_batch_size": 8, "physical_batch_size": 4}
    if privacy.get("num_units", 0) is None:
        raw["privacy"].pop("num_units")
    return write_contract(tmp_path / "c.yaml", raw)


def test_budget_estimate_loads_the_model_and_times_a_synthetic_step(tmp_path, tiny_model_dir, tickets_csv):
    import json

    from typer.testing import CliRunner

    from dplora.cli.app import app

    cfg = _budget_contract(tmp_path, tiny_model_dir, tickets_csv, num_units=120)
    res = CliRunner().invoke(app, ["budget", str(cfg), "--estimate", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)["estimate"]
    inputs = doc["inputs"]
    assert (inputs["steps"], inputs["expected_batch_size"], inputs["physical_batch"], inputs["max_seq_len"]) == (
        3, 8.0, 4, 48,
    )  # fmt: skip
    assert inputs["records_basis"] == "row" and inputs["probe_seconds"] > 0
    assert doc["forwards_per_step"] == 2 and doc["seconds"] == pytest.approx(3 * 2 * inputs["probe_seconds"])
    res = CliRunner().invoke(app, ["budget", str(cfg), "--estimate"])
    assert res.exit_code == 0 and "estimate: about " in res.stdout and "not from the data" in res.stdout
    plain = CliRunner().invoke(app, ["budget", str(cfg), "--json"])
    assert "estimate" not in json.loads(plain.stdout)


def test_budget_estimate_refuses_a_plan_on_a_counted_private_n(tmp_path, tiny_model_dir, tickets_csv):
    from typer.testing import CliRunner

    from dplora.cli.app import app

    cfg = _budget_contract(tmp_path, tiny_model_dir, tickets_csv, num_units=None)
    res = CliRunner().invoke(app, ["budget", str(cfg), "--estimate", "--show-private"])
    assert res.exit_code == 2
    assert "--estimate is a public number and this plan rests on a counted N" in res.output
