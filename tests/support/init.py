"""Helpers shared by tests/cli/test_init.py and its slow tier under tests/slow/."""

from __future__ import annotations

from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.contract.loader import load_contract

DECLARED = {
    "target_epsilon: DECLARE": "target_epsilon: 8.0",
    "delta: DECLARE": "delta: 1.0e-5",
    "num_units: DECLARE": "num_units: 200",
}


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def filled(path, n: int = 200):
    text = path.read_text()
    for old, new in DECLARED.items():
        new = new.replace("200", str(n))
        assert text.count(old) == 1
        text = text.replace(old, new)
    path.write_text(text)
    return load_contract(path)
