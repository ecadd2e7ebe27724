"""Issue 44's behaviour lock, added on main before any file moved: ``--help`` of every command and the demo
contract's signed record must stay as they were.

- ``--help``: every command and sub-command's help at a fixed 100-column, colour-free terminal, byte for byte
  against ``help/<command path>.txt``.
- The record: the demo contract (``configs/demo.yaml``: its privacy, LoRA and training sections) trained on the
  tiny model for 3 steps; the signed predicate's key set and every value except run ids, times, digests and the
  event's serialised form equal ``record_demo.json``.

Regenerate only on purpose (a reviewed behaviour change): ``DPLORA_GOLDEN_WRITE=1 pytest tests/golden``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.golden import WRITE
from typer.main import get_command
from typer.testing import CliRunner

from dplora.cli.app import app

HERE = Path(__file__).parent


def _commands(group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    if hasattr(group, "commands"):  # typer ships its own click: no isinstance on click.Group
        for name in sorted(group.commands):
            out += _commands(group.commands[name], (*prefix, name))
    return out


COMMANDS = _commands(get_command(app))


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "dplora")
def test_help_is_unchanged(path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("TERM", "dumb")
    result = CliRunner().invoke(app, [*path, "--help"], prog_name="dplora")
    assert result.exit_code == 0, result.output
    golden = HERE / "help" / (("_".join(path) or "dplora") + ".txt")
    if WRITE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(result.output)
    assert result.output == golden.read_text()


def test_every_command_has_a_golden_help():
    """No golden file is orphaned and no command is missing one (a renamed command would otherwise pass)."""
    names = {("_".join(p) or "dplora") + ".txt" for p in COMMANDS}
    assert names == {p.name for p in (HERE / "help").glob("*.txt")}
    assert len(names) > 15
