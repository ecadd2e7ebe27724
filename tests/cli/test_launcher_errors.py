"""Bad input under a launcher: every process exits 2, only the first one on the node prints its line.

Under ``torchrun --nproc-per-node W`` each process read the same contract and printed the same error line, W times,
above torch's own failure summary. Now the processes other than the first on a node exit 2 silently (the admission
gate hands rank 0 any refusal that only another rank meets). torchrun itself still exits 1 and prints its
ChildFailedError summary: that is torch's launcher, documented in docs/multi-gpu.md and docs/commands.md.
"""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.cli.common import fail, quiet_worker
from dplora.errors import BadInputError, TrainingFailedError


@pytest.mark.parametrize(
    ("env", "quiet"),
    [
        ({}, False),
        ({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}, False),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}, False),
        ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}, True),
        ({"WORLD_SIZE": "16", "RANK": "8", "LOCAL_RANK": "0"}, False),  # the first process of the second node
        ({"WORLD_SIZE": "2", "RANK": "1"}, True),
        ({"WORLD_SIZE": "2", "LOCAL_RANK": "x"}, False),
    ],
)
def test_which_processes_stay_quiet(env, quiet):
    assert quiet_worker(env) is quiet


def test_a_quiet_process_prints_bad_input_but_not_a_failure(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    exit_ = fail(BadInputError("data file not found: x.csv"), as_json=True)
    assert isinstance(exit_, typer.Exit) and exit_.exit_code == 2
    assert capsys.readouterr() == ("", "")
    exit_ = fail(TrainingFailedError("out of memory"))  # not the same on every rank: each says its own
    assert exit_.exit_code == 4 and "out of memory" in capsys.readouterr().err


def test_a_usage_error_is_quiet_in_the_other_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    result = CliRunner().invoke(app, ["trian"])
    assert result.exit_code == 2 and result.output == ""


@pytest.mark.parametrize("under_torchrun", [True, False])
def test_a_quiet_process_lingers_under_torchrun_so_the_first_one_can_speak(monkeypatch, capsys, under_torchrun):
    """torchrun stops every other process once one exits: a quiet process (not the node's first) that exits on bad
    input waits the grace period first, silently; outside torchrun's agent it exits at once."""
    import time

    from dplora.cli import common

    monkeypatch.setattr(common, "QUIET_EXIT_GRACE_S", 0.3)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    if under_torchrun:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    else:
        monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    start = time.monotonic()
    result = fail(BadInputError("contract: unknown key 'x'"))
    waited = time.monotonic() - start
    assert result.exit_code == 2 and capsys.readouterr().err == ""
    assert (waited >= 0.3) if under_torchrun else (waited < 0.2), waited
