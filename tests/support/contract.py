"""Helpers shared by tests/contract/test_contract.py and its slow tier under tests/slow/."""

from __future__ import annotations

from pathlib import Path

from conftest import contract_dict


def shared_raw():
    return contract_dict(Path("/m"), Path("d.csv"), Path("out"))
