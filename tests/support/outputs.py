"""Helpers shared by tests/run/test_outputs.py and its slow tier under tests/slow/."""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

runner = CliRunner()


def workdir(tmp_path, monkeypatch, tickets_csv, signing_key) -> Path:
    """A working folder as a new user has it: contract, data and key pair side by side (cwd)."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(tickets_csv, work / "tickets.csv")
    shutil.copy(signing_key[0], work / "signing.key")
    shutil.copy(signing_key[1], work / "signing.pub")
    monkeypatch.chdir(work)
    return work
