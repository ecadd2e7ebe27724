"""Helpers shared by tests/run/test_resume.py and its slow tier under tests/slow/ (test_resume.py and
test_interruption_attacks.py): a contract charged to a population, ``dplora train`` with its ledger, and the
fault-point hook that stops a run at a chosen step."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from conftest import contract_dict, write_contract
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.ledger.store import Ledger
from dplora.run import checkpoint

runner = CliRunner()


T = 8

CI = {"CI": "true"}  # the environment of a CI job: its log is public


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


def train(cfg, db, signing_key, *extra, progress: bool = False, env: dict | None = None):
    """``dplora train cfg`` charged to the ledger ``db`` (``--no-progress`` unless ``progress``), under ``env``
    (e.g. :data:`CI`)."""
    quiet = [] if progress else ["--no-progress"]
    args = ["train", str(cfg), "--signing-key", str(signing_key[0]), *quiet, "--ledger", str(db), *extra]
    return runner.invoke(app, args, env=env)


def partial_dir(out: Path) -> Path:
    """The staging folder ``<output_dir>.partial`` of a run that has not finished."""
    return out.with_name(out.name + ".partial")


def hook_fault_point(monkeypatch, point: str, step: int, action) -> None:
    """Run ``action`` at ``dplora.run.checkpoint.fault_point(point, step)``."""
    real = checkpoint.fault_point

    def hook(p, s):
        if (p, s) == (point, step):
            action()
        real(p, s)

    monkeypatch.setattr(checkpoint, "fault_point", hook)


def sigterm() -> None:
    """Send SIGTERM to this process (a deadline, or a user's Ctrl-C as a job scheduler sends it)."""
    os.kill(os.getpid(), signal.SIGTERM)
