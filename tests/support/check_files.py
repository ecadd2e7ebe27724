"""Helpers shared by tests/cli/test_check_files.py and its slow tier under tests/slow/."""

from __future__ import annotations

from conftest import contract_dict, write_contract
from typer.testing import CliRunner

from dplora.cli.app import app

SECRET = "SECRET-7f3a"


def shared_cfg(tmp_path, model, data_path, **sections):
    raw = contract_dict(model, data_path, tmp_path / "out", **sections)
    raw["privacy"]["num_units"] = 100
    return write_contract(tmp_path / "c.yaml", raw)


def validate(cfg, *extra):
    return CliRunner().invoke(app, ["validate", str(cfg), "--check-files", *extra])
