"""The slow tier of tests/run/test_estimate.py, whose docstring describes the module."""

from __future__ import annotations

import dataclasses
import re
import types

import pytest
import torch
from conftest import train_tiny

from dplora.engine import membatch
from dplora.plan import estimate as est
from dplora.run import checkpoint

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


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

    def spy(*args, **kwargs):
        captured.append((args, kwargs))
        order.append("estimate")
        return real(*args, **kwargs)

    def step(point, _step):
        if point == "after-step":  # once per logical step, right after it
            order.append("step")

    monkeypatch.setattr(est, "estimate_inputs", spy)
    monkeypatch.setattr(membatch, "time_synthetic_step", lambda *a, **k: 0.25)  # a fixed clock: compare the rest
    lines = []
    for name, path in zip(("a", "b"), _neighbours(tmp_path), strict=True):
        with checkpoint.fault_hook(step):
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
