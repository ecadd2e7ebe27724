"""Helpers shared by tests/engine/test_device_rules.py and its slow tier under tests/slow/."""

from __future__ import annotations

from devicerules import CudaRules

from dplora.contract.loader import parse_contract
from dplora.recipe.config import RunOptions
from dplora.recipe.train import run_training


def shared_contract(tmp_path, model_dir, data_csv, *, model=None, training=None, privacy=None):
    return parse_contract(
        {
            "privacy": {
                "protected_unit": "user",
                "unit_key": "customer_id",
                "adjacency": "add_remove",
                "target_epsilon": 50.0,
                "delta": 1e-5,
                "accountant": "rdp",
                "max_grad_norm": 1.0,
                "noise_multiplier": 1.0,
                "num_units": 40,  # a public N: the fixture's ~40 customers
                **(privacy or {}),
            },
            "model": {"path": str(model_dir), **(model or {})},
            "data": {"path": str(data_csv), "prompt_column": "message", "response_column": "reply"},
            "lora": {"r": 4, "alpha": 8},
            "training": {
                "expected_batch_size": 8,
                "physical_batch_size": 4,
                "steps": 2,
                "lr": 0.01,
                "max_seq_len": 24,
                "output_dir": str(tmp_path / "run"),
                **(training or {}),
            },
        }
    )


def train(contract, signing_key, log=None):
    lines = []
    with CudaRules() as rules:
        result = run_training(
            contract,
            RunOptions(signing_key=signing_key[0], data_key=None, progress=False, threads=1),
            log=log or lines.append,
        )
    return result, rules, lines
