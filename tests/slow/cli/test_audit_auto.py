"""``dplora audit`` resolves planner ``auto`` values as ``dplora train`` does, before the attach check and training."""

from __future__ import annotations

from conftest import contract_dict, write_contract

from dplora.cli.audit import prepare_audit
from dplora.contract.loader import load_contract
from dplora.plan.resolve import resolve_auto


def test_audit_contract_has_the_planners_batch_steps_and_lr(tmp_path, tiny_model_dir, tickets_csv):
    raw = contract_dict(
        tiny_model_dir,
        tickets_csv,
        tmp_path / "run",
        privacy={"num_units": 1000},
        training={"expected_batch_size": "auto", "steps": "auto", "epochs": 2},
    )
    cfg = write_contract(tmp_path / "audit.yaml", raw)
    contract, _, folder, target, _ = prepare_audit(cfg, [], "private", tmp_path / "audit", None, None)
    _, rec = resolve_auto(load_contract(cfg, []))
    training = contract.training
    assert target is None and folder == tmp_path / "audit"
    assert (training.expected_batch_size, training.steps) == (rec.choice.expected_batch_size, rec.choice.steps)
    assert training.lr == rec.choice.lr and training.output_dir == str(tmp_path / "audit" / "run")
