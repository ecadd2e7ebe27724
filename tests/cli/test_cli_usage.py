"""Issue 8, items 2, 4, 5 and 9: one-line usage errors, overrides on the command line, CI progress lines,
--version, 80-column help and ledger output, keygen's message, usage placeholders, threads from free cores."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from support.cli_usage import runner

import dplora
from dplora.cli.app import app
from dplora.run.progress import ProgressReporter

ROOT = Path(__file__).resolve().parents[2]


def _one_line_usage_error(result, *needles: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and "╭" not in line and "Usage:" not in line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["trian"], ["No such command 'trian'", "Did you mean 'train'?"]),
        (["train", "c.yaml", "--overwite"], ["No such option: --overwite", "'dplora train --help'"]),
        (["train", "c.yaml", "--threads", "0"], ["'--threads'", "greater than or equal to 1"]),
        (["train", "c.yaml", "--threads", "two"], ["'--threads'"]),
        (["budget"], ["Missing argument 'CONFIG'"]),
        (["verify", "run"], ["Missing option '--public-key'"]),
        (["ledger", "shwo"], ["No such command 'shwo'", "'dplora ledger --help'"]),
    ],
)
def test_usage_errors_are_one_line_with_exit_2(args, needles):
    _one_line_usage_error(runner.invoke(app, args), *needles)


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"dplora {dplora.__version__}\n"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{dplora.__version__}"' in pyproject


COMMANDS = [
    [],
    ["budget"],
    ["train"],
    ["validate"],
    ["keygen"],
    ["verify"],
    ["demo-data"],
    ["prepare-twcs"],
    ["ledger"],
    ["ledger", "set-cap"],
    ["ledger", "check"],
    ["ledger", "show"],
    ["ledger", "settle"],
    ["ledger", "record-release"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "dplora")
def test_help_fits_80_columns_without_cuts(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert not any(ch in result.stdout for ch in "…╭│")  # no rich boxes, nothing cut with an ellipsis
    assert not any(line.rstrip().endswith("...") for line in lines if not line.startswith("Usage:"))
    usage = lines[0]
    assert usage.startswith(f"Usage: dplora {' '.join(command)}".rstrip())
    # one placeholder style: upper-case names, {REQUIRED} and [OPTIONAL], e.g. {CONFIG} [KEY=VALUE]...
    for placeholder in re.findall(r"[{\[]([^}\]]+)[}\]]", usage):
        assert placeholder == placeholder.upper(), usage


def test_override_of_an_exclusive_pair_on_the_command_line():
    """Item 4 through the CLI: a steps override on a contract with epochs validates."""
    cfg = ROOT / "configs" / "demo.yaml"
    assert runner.invoke(app, ["validate", str(cfg), "training.epochs=2"]).exit_code == 0
    result = runner.invoke(app, ["validate", str(cfg), "training.epochs=2", "training.steps=5"])
    assert result.exit_code == 2 and "give exactly one of" in result.stderr


def test_ledger_show_fits_80_columns_with_full_ids(tmp_path, monkeypatch):
    from dplora.ledger.store import Ledger

    monkeypatch.setenv("COLUMNS", "80")
    db = tmp_path / "l.sqlite3"
    run_id, sha = "b832f4677daa40699b3e7cd980a46a92", "ab" * 32
    with Ledger(db) as ledger:
        ledger.set_cap(
            "support-tickets-eu", epsilon_max="10", delta_max="1e-4", protected_unit="row", adjacency="add_remove"
        )
        ledger.reserve(
            protected_unit="row",
            population="support-tickets-eu",
            run_id=run_id,
            epsilon="3.1234567",
            delta="1e-6",
            accountant="prv",
            adjacency="add_remove",
            purpose="release",
        )
        ledger.settle(run_id, epsilon_spent="2.987654321", status="settled")
        ledger.record_release(run_id=run_id, record_sha256=sha, epsilon="2.987654321", delta="1e-6", label="final")
    result = runner.invoke(app, ["ledger", "show", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    for whole in (run_id, sha, "2.987654321", "3.1234567", "7.012345679", "0.000099"):
        assert whole in result.stdout, whole
    assert "…" not in result.stdout


def test_keygen_already_exists_names_overwrite(tmp_path):
    key = tmp_path / "k.key"
    assert runner.invoke(app, ["keygen", str(key)]).exit_code == 0
    result = runner.invoke(app, ["keygen", str(key)])
    assert result.exit_code == 2
    assert result.stderr == f"error: {key} already exists; pass --overwrite to replace it, or choose another path\n"
    assert runner.invoke(app, ["keygen", str(key), "--overwrite"]).exit_code == 0


def test_demo_data_already_exists_names_the_option(tmp_path):
    path = tmp_path / "t.csv"
    assert runner.invoke(app, ["demo-data", str(path), "--tickets", "3"]).exit_code == 0
    result = runner.invoke(app, ["demo-data", str(path), "--tickets", "3"])
    assert result.exit_code == 2 and "pass --overwrite" in result.stderr and "overwrite=True" not in result.stderr


def test_threads_follow_the_cores_free_now(monkeypatch):
    """4 cores, 3 of them busy in the last 0.3 s (from /proc/stat), whatever the 1-minute load says: 1 thread."""
    import time

    from dplora.engine import runtime

    # cpu total and idle+iowait jiffies over the window: 400 jiffies, 100 idle → 3 busy cores of 4
    samples = iter(["cpu  1000 0 0 1000 0 0 0 0 0 0\n", "cpu  1300 0 0 1100 0 0 0 0 0 0\n"])
    monkeypatch.setattr(runtime, "open", lambda *a, **k: io.StringIO(next(samples)), raising=False)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert runtime.free_threads() == 1
    samples = iter(["cpu  1000 0 0 1000 0 0 0 0 0 0\n", "cpu  1000 0 0 1400 0 0 0 0 0 0\n"])  # all idle now
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (4.0, 4.0, 4.0))  # a job that just ended
    assert runtime.free_threads() == 4


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_lines_are_public_every_k_steps():
    """Not a TTY (a CI log): a line at step 1, every K = ⌈T/10⌉ steps and at T, with the step, T and the planned ε
    only; no s/step, no ETA, no loss, and no time-based cadence (issue 48: the same lines whatever the clock says)."""
    outputs = []
    for seconds in (5.0, 500.0):  # two runs whose steps take very different (private) times
        stream, clock = io.StringIO(), _Clock()
        with ProgressReporter(stream=stream, interval_s=30, clock=clock) as reporter:
            assert reporter.mode == "lines"
            reporter.start(24)
            for step in range(1, 25):
                clock.now = seconds * step
                reporter.update(step, epsilon=step / 3, seconds_per_step=seconds, loss=1.234)
        outputs.append(stream.getvalue())
    assert outputs[0] == outputs[1]
    lines = outputs[0].splitlines()
    assert [int(re.search(r"step (\d+)/24", ln).group(1)) for ln in lines] == [1, 3, 6, 9, 12, 15, 18, 21, 24]
    assert lines[0] == "progress: step 1/24, planned ε after it 0.3333"
    assert lines[-1] == "progress: step 24/24, planned ε after it 8.0000"
    assert "1.234" not in outputs[0] and "s/step" not in outputs[0] and "ETA" not in outputs[0]


def test_progress_under_ci_is_lines_even_on_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setenv("CI", "true")
    assert ProgressReporter(stream=Tty()).mode == "lines"
    monkeypatch.setenv("CI", "false")
    assert ProgressReporter(stream=Tty()).mode == "bar"


def test_progress_bar_on_a_tty_and_nothing_when_disabled(monkeypatch):
    monkeypatch.delenv("CI", raising=False)

    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert ProgressReporter(stream=Tty()).mode == "bar"
    quiet = io.StringIO()
    with ProgressReporter(enabled=False, stream=quiet) as reporter:
        reporter.start(3)
        for step in (1, 2, 3):
            reporter.update(step, 0.1, 1.0)
    assert quiet.getvalue() == "" and reporter.mode == "off"


def test_validate_json_is_one_document_on_success_and_on_error(tmp_path):
    """validate --json: {"ok": true, "sha256": ...} for a valid contract; the error document (exit 2) otherwise."""
    import json

    cfg = ROOT / "configs" / "demo.yaml"
    ok = runner.invoke(app, ["validate", str(cfg), "--json"])
    doc = json.loads(ok.stdout)
    assert ok.exit_code == 0 and doc["ok"] is True and len(doc["sha256"]) == 64
    bad = runner.invoke(app, ["validate", str(cfg), "privacy.delta=2", "--json"])
    doc = json.loads(bad.stdout)
    assert bad.exit_code == 2 and doc["ok"] is False and doc["exit_code"] == 2 and "delta" in doc["error"]
