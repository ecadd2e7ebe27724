"""A ``dplora train`` of a contract naming a Hugging Face hub id, shared by tests/engine/test_hub_model.py and its slow
tier under tests/slow/."""

from __future__ import annotations

from pathlib import Path

from conftest import contract_dict, write_contract

from dplora.cli.app import app
from support.hub_model import runner


def train_hub_id(tmp_path: Path, data_csv: Path, signing_key, name: str):
    """``dplora train`` (CLI runner) of the small contract with ``model: {name: NAME}``, output tmp_path/run."""
    raw = contract_dict(Path("unused"), data_csv, tmp_path / "run")
    raw["model"] = {"name": name}
    cfg = write_contract(tmp_path / "hub.yaml", raw)
    return runner.invoke(app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"])
