"""Helpers shared by tests/evaluate/test_evaluate.py and its slow tier under tests/slow/."""

from __future__ import annotations

from typer.testing import CliRunner

runner = CliRunner()
