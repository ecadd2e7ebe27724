"""Clipping guidance and charged tuning on a tiny random Llama: brute-force norms, a 3-trial sweep, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import contract_dict
from support.tuning import auto_sweep_contract


def _brute_force_unit_norms(contract, table) -> np.ndarray:
    """Reference: one record at a time, its own backward; a unit's vector is the sum of its records' gradients."""
    import torch

    from dplora.data import tokens as tokenizing
    from dplora.data import units as data_mod
    from dplora.engine.batch import collate, per_sequence_loss
    from dplora.engine.lora import setup_model
    from dplora.engine.model import select_device

    model, tokenizer = setup_model(
        contract.model, contract.lora, contract.training, select_device(), "fp32", False, lambda *_: None
    )  # the same LoRA init
    named = [p for _, p in model.named_parameters() if p.requires_grad]
    examples = tokenizing.tokenize_records(table, tokenizer, contract.data, max_seq_len=contract.training.max_seq_len)
    index = data_mod.build_unit_index(table, contract.privacy, seed=contract.training.seed)
    norms = []
    for records in index.records_of_unit:
        total = torch.zeros(sum(p.numel() for p in named), dtype=torch.float64)
        for r in records:
            model.zero_grad(set_to_none=True)
            per_sequence_loss(model, collate([examples[r]], tokenizer.pad_token_id)).sum().backward()
            total += torch.cat([p.grad.reshape(-1) for p in named]).double()
        norms.append(float(total.norm()))
    return np.array(norms)


@pytest.mark.parametrize("unit", ["row", "user"])
def test_clip_guide_norms_match_brute_force(tmp_path, tiny_model_dir, unit):
    """Per-unit norms equal a one-record-at-a-time backward (summed per customer at user level) to 1e-5; the
    quantiles equal numpy's on those norms; the clipped share is the share of norms above C."""
    from dplora.contract.loader import parse_contract
    from dplora.data import public as public_data
    from dplora.tuning import clipguide

    privacy = {"protected_unit": unit, "max_grad_norm": 0.5}
    if unit == "user":
        privacy["unit_key"] = "customer_id"
    raw = contract_dict(tiny_model_dir, tmp_path / "private.csv", tmp_path / "run", privacy=privacy)
    contract = parse_contract(raw)
    table, source = public_data.public_table(
        contract.data, contract.privacy, None, num_tickets=24, option="--public", units=True
    )
    guide = clipguide.clip_guide(contract, table, source, sample=1000, threads=1, log=lambda *_: None)
    reference = _brute_force_unit_norms(contract, table)
    assert len(guide.norms) == len(reference) == (24 if unit == "row" else len(set(table["customer_id"])))
    if unit == "user":
        assert guide.records_per_unit.max() > 1  # some customers have several tickets: unit sums are exercised
    np.testing.assert_allclose(guide.norms, reference, rtol=1e-5, atol=1e-7)
    expected = np.quantile(reference, [0.1, 0.25, 0.5, 0.75, 0.9])
    np.testing.assert_allclose(list(guide.quantiles.values()), expected, rtol=1e-5)
    assert guide.suggested_c == pytest.approx(float(np.median(reference)), rel=1e-5)
    assert guide.clipped_fraction == pytest.approx(float(np.mean(reference > 0.5)))
    assert "demo generator" in guide.source


def test_composition_of_pld_trials_is_at_most_basic():
    """PLD trials (also replace-one) compose in dp_accounting; the stated total is the smaller valid bound."""
    from dplora.accounting.composition import compose

    trial = {"epsilon": 1.5, "delta": 1e-6, "sample_rate": 0.05, "noise_multiplier": 2.0, "steps": 20}
    for adjacency in ("add_remove", "replace_one"):
        total = compose([{**trial, "accountant": "pld"}] * 3, adjacency)
        assert total["compositions"]["basic"]["epsilon_exact"] == "4.5"
        assert total["total_delta_exact"] == "0.000003"
        assert "epsilon" in total["compositions"]["pld"]
        assert total["total_epsilon"] == min(v["epsilon"] for v in total["compositions"].values() if "epsilon" in v)
        assert ("rdp" in total["compositions"]) == (adjacency == "add_remove")


def test_sweep_plans_auto_batch_and_steps_as_train_does(tmp_path, tiny_model_dir, tickets_csv):
    """``training.expected_batch_size: auto`` in a sweep: every trial is planned on the planner's B and T (the ones
    run_training resolves), so the ledger check composes the trials that will run."""
    from dplora.plan.resolve import resolve_auto
    from dplora.tuning.sweep import SweepOptions, _check_budget, _contracts

    db = tmp_path / "ledger.sqlite3"
    cfg = auto_sweep_contract(tmp_path, tiny_model_dir, tickets_csv, db, "100")
    contracts = _contracts(cfg, [], [["training.lr=0.01"], ["training.lr=0.02"]], tmp_path / "sweep")
    plans = _check_budget(contracts, SweepOptions(out_dir=tmp_path / "sweep", ledger_path=db))
    for contract, plan in zip(contracts, plans, strict=True):
        choice = resolve_auto(contract)[1].choice
        assert (plan.steps, plan.sample_rate) == (choice.steps, choice.expected_batch_size / 1000)
        assert plan.steps <= 60 and plan.epsilon <= 8


def test_an_audit_attached_to_a_sweep_release_composes_every_trial():
    """``audit --attach`` on a sweep release: the claim and ceiling compose every trial and the audit run, not the
    chosen trial alone (the signed record is a function of all of them)."""
    from dplora.release.audit_section import composed_runs

    trial = {"epsilon": 1.0, "delta": 1e-5, "accountant": "pld", "sample_rate": 0.2, "noise_multiplier": 1.0}
    per_trial = [{**trial, "steps": 2, "overrides": ["a"]}, {**trial, "steps": 3, "overrides": ["b"]}]
    record = {
        "accounting": {**{k: trial[k] for k in ("delta", "accountant", "sample_rate", "noise_multiplier")}},
        "tuning": {"per_trial": per_trial},
    }
    record["accounting"] |= {"epsilon_spent": 1.0, "steps_done": 2}
    mechanism = {**{k: trial[k] for k in ("delta", "accountant", "sample_rate", "noise_multiplier")}, "steps": 4}
    section = {"data": {"source": "private"}, "mechanism": mechanism, "claimed_epsilon": 1.0}
    runs = composed_runs(record, section)
    assert [r["run"] for r in runs] == ["trial 1", "trial 2", "audit"]
    assert [r["steps"] for r in runs] == [2, 3, 4]
    del record["tuning"]
    assert [r["run"] for r in composed_runs(record, section)] == ["release", "audit"]
