"""Helpers shared by tests/cli/test_cli_usage.py and its slow tier under tests/slow/."""

from __future__ import annotations

from typer.testing import CliRunner

runner = CliRunner()
