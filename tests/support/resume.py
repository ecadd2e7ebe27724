"""Helpers shared by tests/run/test_resume.py and its slow tier under tests/slow/."""

from __future__ import annotations

from pathlib import Path

from conftest import contract_dict, write_contract
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.ledger.store import Ledger

runner = CliRunner()


T = 8


def setup(tmp_path: Path, tiny_model_dir, data, name: str, **training) -> tuple[Path, Path, Path]:
    """A contract charged to population 'tickets' in its own ledger: (config, output folder, ledger)."""
    db = tmp_path / f"{name}.sqlite3"
    Ledger(db).set_cap("tickets", epsilon_max="100", delta_max="1e-3", protected_unit="row", adjacency="add_remove")
    out = tmp_path / name
    raw = contract_dict(
        tiny_model_dir,
        data,
        out,
        privacy={"population": "tickets"},
        training={"steps": T, "checkpoint_every": 2, **training},
    )
    return write_contract(tmp_path / f"{name}.yaml", raw), out, db


def _train(cfg, db, signing_key, *extra):
    args = ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress", "--ledger", str(db), *extra]
    return runner.invoke(app, args)


def _partial(out: Path) -> Path:
    return out.with_name(out.name + ".partial")
