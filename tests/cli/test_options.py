"""Shared CLI options are declared once, in ``dplora/cli/options.py`` (issue 44 item 5), and keep their bounds."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dplora.cli import options
from dplora.cli.app import app

CLI = Path(options.__file__).parent
# parameter names of the shared options whose flag typer derives from the parameter (no explicit "--name")
SHARED_PARAMS = {
    "signing_key",
    "data_key",
    "ledger",
    "db",
    "threads",
    "progress",
    "overwrite",
    "public_key",
    "prompts",
    "max_new_tokens",
    "temperature",
}
SHARED_FLAGS = {"--json", "--show-private", "--allow-non-private", "--ledger"}


def _option_calls(node: ast.AST) -> list[ast.Call]:
    return [c for c in ast.walk(node) if isinstance(c, ast.Call) and ast.unparse(c.func) == "typer.Option"]


def _declarations_outside_options() -> list[str]:
    """``module:line flag`` for each ``typer.Option`` call outside options.py that declares a shared option."""
    found = []
    for path in sorted(CLI.glob("*.py")):
        if path.name == "options.py":
            continue
        tree = ast.parse(path.read_text())
        aliases = {
            n.targets[0].id: n.value
            for n in tree.body
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
        }
        for call in _option_calls(tree):
            flags = {a.value for a in call.args if isinstance(a, ast.Constant)}
            found += [f"{path.name}:{call.lineno} {f}" for f in sorted(flags & SHARED_FLAGS)]
        for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            for arg in func.args.args + func.args.kwonlyargs:
                if arg.arg not in SHARED_PARAMS or arg.annotation is None:
                    continue
                ann = arg.annotation
                name = ann.value if isinstance(ann, ast.Constant) else ast.unparse(ann)
                value = aliases.get(name, ann)
                found += [f"{path.name}:{c.lineno} --{arg.arg.replace('_', '-')}" for c in _option_calls(value)]
    return found


def test_shared_options_are_declared_only_in_options_py():
    assert _declarations_outside_options() == []


def test_the_scan_finds_a_planted_declaration(tmp_path, monkeypatch):
    """The scan above is not vacuous: a --json or a --threads declared in a command module is caught."""
    planted = tmp_path / "cli"
    planted.mkdir()
    (planted / "options.py").write_text("")
    (planted / "cmd.py").write_text(
        "import typer\nfrom typing import Annotated\n"
        'J = Annotated[bool, typer.Option("--json", help="x")]\n'
        'T = Annotated[int | None, typer.Option(min=1, help="CPU threads.")]\n'
        "def cmd(as_json: J = False, threads: T = None): ...\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "CLI", planted)
    assert _declarations_outside_options() == ["cmd.py:3 --json", "cmd.py:4 --threads"]


def test_environment_names_are_the_librarys():
    from dplora.ledger.store import LEDGER_ENV
    from dplora.release.envelope import DATA_KEY_ENV
    from dplora.release.keys import SIGNING_KEY_ENV

    assert (options.SIGNING_KEY_ENV, options.DATA_KEY_ENV, options.LEDGER_ENV) == (
        SIGNING_KEY_ENV,
        DATA_KEY_ENV,
        LEDGER_ENV,
    )
    assert (SIGNING_KEY_ENV, DATA_KEY_ENV, LEDGER_ENV) == ("DPLORA_SIGNING_KEY", "DPLORA_DATA_KEY", "DPLORA_LEDGER")


@pytest.mark.parametrize(
    "args",
    [
        (["train", "c.yaml", "--threads", "0"]),
        (["train", "c.yaml", "--threads", "1025"]),
        (["clip-guide", "c.yaml", "--threads", "1025"]),
        (["sweep", "c.yaml", "--out", "d", "--threads", "1025"]),
        (["audit", "c.yaml", "--threads", "0"]),
        (["eval", "run", "--threads", "0"]),
        (["synth", "run", "--rows", "1", "--out", "f.csv", "--threads", "0"]),
        (["generate", "run", "--max-new-tokens", "0"]),
        (["synth", "run", "--rows", "1", "--out", "f.csv", "--temperature", "-0.5"]),
    ],
)
def test_bounds_refuse_out_of_range_values_with_exit_2(args):
    """The factories' bounds: threads >= 1 (<= 1024 where the command states it), tokens >= 1, temperature >= 0."""
    result = CliRunner().invoke(app, args, prog_name="dplora")
    assert result.exit_code == 2, result.output
    assert "Invalid value" in result.output and "--" in result.output


def test_threads_1025_is_accepted_where_no_upper_bound_is_stated(tmp_path):
    """eval states no upper bound: 1025 passes parsing and the command fails later, on the missing run (exit 2)."""
    result = CliRunner().invoke(app, ["eval", str(tmp_path / "nowhere"), "--threads", "1025"], prog_name="dplora")
    assert result.exit_code == 2
    assert "Invalid value" not in result.output
