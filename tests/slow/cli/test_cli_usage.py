"""The slow tier of tests/cli/test_cli_usage.py, whose docstring describes the module."""

from __future__ import annotations

import subprocess
import sys

from support.cli_usage import runner

from dplora.cli.app import app


def test_usage_error_in_a_real_process():
    """The console script too: one line on stderr, exit 2, no box."""
    proc = subprocess.run(
        [sys.executable, "-c", "from dplora.cli.app import main; main()", "trian"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "error: No such command 'trian'. Did you mean 'train'? (see 'dplora --help')\n"


def test_generate_json_error_is_one_json_document(tmp_path):
    """generate --json on a folder that is not a run: exit 2 and one error document on stdout, nothing else."""
    import json

    result = runner.invoke(app, ["generate", str(tmp_path / "no-run"), "--prompt", "hi", "--no-verify", "--json"])
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2 and doc["error"]
