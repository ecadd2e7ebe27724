"""Attacks on the quiet rules (``quiet_worker``, ``in_notebook``): bad data under CI is one line naming no record
text, and a notebook kernel's child never echoes private lines, even on a tty."""

from __future__ import annotations

import pytest
from conftest import contract_dict, write_contract
from support.error_line import one_error_line
from typer.testing import CliRunner

from dplora.cli.app import app

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("badjson.jsonl", b'{"message": "hi", "reply": "ok"}\n{"message": "SECRETA", "reply": "SECRETB"\n'),
        ("dictval.jsonl", b'{"message": "hi", "reply": "ok"}\n{"message": {"SECRETC": "SECRETD"}, "reply": "x"}\n'),
        ("extra.csv", b"message,reply\nhi,ok\nSECRETE,SECRETF,SECRETG\n"),
        ("latin1.csv", b"message,reply\nhi,ok\nSECRETH\xff,ok\n"),
        ("quote.csv", b'message,reply\nhi,ok\n"SECRETI,ok\n'),
    ],
)
def test_a_bad_data_file_under_ci_is_one_line_naming_no_record_text(name, raw, tmp_path, tiny_model_dir, monkeypatch):
    """What the first process of a launcher prints for bad data (quiet_worker is False there, as in one process):
    one line, exit 2, no cell of the file."""
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("WORLD_SIZE", "1")
    data = tmp_path / name
    data.write_bytes(raw)
    cfg = write_contract(
        tmp_path / "c.yaml", contract_dict(tiny_model_dir, data, tmp_path / "o", privacy={"num_units": 10})
    )
    got = runner.invoke(app, ["train", str(cfg), "--no-progress"])
    assert got.exit_code == 2
    one_error_line(got)
    assert "SECRET" not in got.output


@pytest.mark.parametrize(
    ("env", "notebook"),
    [
        ({"JPY_PARENT_PID": "123"}, True),
        ({"JPY_PARENT_PID": "  "}, False),
        ({"TERM": "xterm-color", "CLICOLOR": "1", "PAGER": "cat", "GIT_PAGER": "cat"}, True),
        ({"TERM": "xterm-color", "CLICOLOR": "1", "PAGER": "cat"}, False),
    ],
)
def test_a_kernel_child_never_echoes_private_lines_even_on_a_tty(env, notebook, monkeypatch):
    from dplora import surface

    for k in ("JPY_PARENT_PID", "TERM", "CLICOLOR", "PAGER", "GIT_PAGER", "CI", surface.SHOW_PRIVATE_ENV):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    class Tty:
        def isatty(self):
            return True

    assert surface.in_notebook() is notebook
    assert surface.echo_private(stream=Tty()) is (not notebook)
    assert surface.echo_private(stream=Tty(), as_json=True) is False
