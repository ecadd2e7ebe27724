"""Attacks on "the step an interruption reached stays private" (docs/resume.md, "The step an
interruption reached is private").

The guarantee: when a signal, a kill or a failure that read no DP output (out of memory, a full disk, a crash) stops
a run at step k, no public output depends on k (nor on what determines it: the steps done, ε after them, the
checkpoint's step, the failure time), other than the progress lines printed before the signal and a resumed run's
first progress line. Public: the job log under CI=true, ``--json`` documents, ``<output_dir>.partial/FAILED.json``,
``dplora ledger`` commands, the resumed run's log and record, exit codes, names outside ``.partial``/``.private``,
tracker files (``<output_dir>.tracking/``), mtimes.

Each attack stops the same contract on the same data at two different steps (as a deadline that follows the private
batches' times would) and compares what is public. ``test_held_*``: the attack failed (kept as a regression).
``test_fixed_*``: the attack found a public output that depended on k (disk-full byte counts, a signal after the
last step or while publishing, the public FAILED.json's mtime); fixed, kept as a regression.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import re
from pathlib import Path

import pytest
from conftest import contract_dict, release_statement, write_contract
from support.resume import CI, hook_fault_point, partial_dir, sigterm, train
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.ledger.store import Ledger
from dplora.run import checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")

runner = CliRunner()
T = 8  # checkpoints every ⌈T/10⌉ = 1 step by default


def _setup(root: Path, tiny_model_dir, data, **training) -> tuple[Path, Path, Path]:
    """A contract charged to population 'tickets' in its own ledger under ``root``: (config, output, ledger)."""
    root.mkdir(exist_ok=True)
    db = root / "ledger.sqlite3"
    Ledger(db).set_cap("tickets", epsilon_max="100", delta_max="1e-3", protected_unit="row", adjacency="add_remove")
    out = root / "run"
    raw = contract_dict(tiny_model_dir, data, out, privacy={"population": "tickets"}, training={"steps": T, **training})
    return write_contract(root / "run.yaml", raw), out, db


def _dplora(*args):
    return runner.invoke(app, list(args), env={"CI": "true"})


def _signal_then(real):
    """``real``, called after a SIGTERM to this process (a deadline that falls while it runs)."""

    def wrapped(*args, **kw):
        sigterm()
        return real(*args, **kw)

    return wrapped


def _public(text: str, root: Path) -> str:
    """``text`` with what differs between two runs by construction masked (their folder, run ids, times, ages) and
    without the lines the guarantee allows to differ (progress lines) or that time a synthetic probe (estimate)."""
    text = text.replace(str(root), "<root>")
    text = re.sub(r"\b[0-9a-f]{32}\b", "<run_id>", text)
    text = re.sub(r"\d{4}-\d\d-\d\d(T[\d:.]+(\+00:00|Z)?)?", "<time>", text)
    text = re.sub(r"\b(\d+d)?\d+h\d\dm\b", "<age>", text)
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith(("estimate:", "progress:")))


def _needs(text: str) -> list[int]:
    """The byte counts a disk-full message names ("it needs N bytes")."""
    return [int(n) for n in re.findall(r"it needs (\d+) bytes", text)]


def _event_steps(tracking: Path) -> list[int]:
    """The steps of the public ε series in the one TensorBoard run under ``<output_dir>.tracking``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run,) = [p for p in (tracking / "tensorboard").iterdir() if p.is_dir()]
    acc = EventAccumulator(str(run))
    acc.Reload()
    return [e.step for e in acc.Scalars("dp/epsilon_spent")]


LINUX_FDS = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds a file by /proc/self/fd")


class _FullDisk:
    """``os`` for :mod:`dplora.atomic` on a disk with no room left for the private ``metrics.jsonl``: an append to it
    (``os.write``) or a new copy of it (``os.fdopen`` of its temporary file) fails with ENOSPC once ``armed``. The
    bytes each failed append tried to write are kept in ``attempted``."""

    def __init__(self, *, armed: bool = False):
        self.armed, self.attempted = armed, []

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def _metrics(fd) -> bool:
        return Path(os.readlink(f"/proc/self/fd/{fd}")).name.lstrip(".").startswith("metrics.jsonl")

    def write(self, fd, data):
        if self.armed and self._metrics(fd):
            self.attempted.append(bytes(data))
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    def fdopen(self, fd, *args, **kw):
        if self.armed and self._metrics(fd):
            os.close(fd)
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.fdopen(fd, *args, **kw)


# --- held --------------------------------------------------------------------------------------------------------


def test_held_tensorboard_files_never_follow_the_step_reached(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """training.report_to: tensorboard, SIGTERM after step 2 or 6. At 91d75d0 the public event file under
    ``<output_dir>.tracking/`` held ε for steps 1..k after the stop and, once resumed, steps k+1..T only (the resumed
    run rewrote the file): k in a public file twice. Now: no tracker file for a stopped run, and the resumed run's
    series is the whole plan, 1..T, whichever step the interruption reached."""
    pytest.importorskip("tensorboard")
    seen = {}
    for k in (2, 6):
        cfg, out, db = _setup(tmp_path / f"k{k}", tiny_model_dir, tickets_csv, report_to="tensorboard")
        hook_fault_point(monkeypatch, "after-step", k, sigterm)
        stopped = train(cfg, db, signing_key, env=CI)
        monkeypatch.undo()
        assert stopped.exit_code == 130, stopped.output
        tracking = out.with_name(out.name + ".tracking")
        after_stop = _event_steps(tracking) if tracking.exists() else None
        resumed = train(cfg, db, signing_key, "--resume", env=CI)
        assert resumed.exit_code == 0, resumed.output
        seen[k] = (after_stop, _event_steps(tracking))
    assert seen[2] == seen[6] == (None, list(range(1, T + 1)))


def test_held_a_second_signal_and_the_resumed_run_name_no_step(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """Two SIGTERMs inside step 3 or step 7 (the second stops at once, mid-step): the job log, --json's error, the
    public FAILED.json and `ledger show` are the same; the resumed run (progress lines on, CI) prints the same lines
    but its progress lines, and its train --json summary and record accounting are the same."""
    from dplora.run import loop

    real = loop.logical_step
    seen = {}
    for k in (2, 6):
        root = tmp_path / f"k{k}"
        cfg, out, db = _setup(root, tiny_model_dir, tickets_csv)

        def step(spec, state, units, k=k):
            if state.step == k:
                sigterm()
                sigterm()
            return real(spec, state, units)

        monkeypatch.setattr(loop, "logical_step", step)
        stopped = train(cfg, db, signing_key, "--json", env=CI)
        monkeypatch.undo()
        assert stopped.exit_code == 130, stopped.output
        assert checkpoint.read_info(partial_dir(out)).step == k  # the private checkpoint holds the step reached
        failed = (partial_dir(out) / "FAILED.json").read_text()
        shown = _dplora("ledger", "show", "--db", str(db), "--json").output
        resumed = train(cfg, db, signing_key, "--resume", "--json", progress=True, env=CI)  # progress lines on
        assert resumed.exit_code == 0, resumed.output
        summary = json.loads(resumed.stdout)
        accounting = release_statement(out)["predicate"]["accounting"]
        seen[k] = [_public(x, root) for x in (stopped.output, failed, shown, resumed.stderr, json.dumps(summary))]
        seen[k].append(accounting)
    assert seen[2] == seen[6]
    assert "send it again to stop at once" in seen[2][0] and "interrupted (SIGTERM)" in seen[2][0]


def test_held_ledger_commands_and_overwrite_name_no_step(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """After SIGTERM at step 2 or 6: `ledger record-release` (refused, exit 2), `ledger settle` without --abandon
    (refused), `ledger show` (plain and --json) and a new run with --overwrite (its note, the ε it settles the
    discarded charge at, then `ledger show` again) are the same."""
    seen = {}
    for k in (2, 6):
        root = tmp_path / f"k{k}"
        cfg, out, db = _setup(root, tiny_model_dir, tickets_csv)
        hook_fault_point(monkeypatch, "after-step", k, sigterm)
        assert train(cfg, db, signing_key, env=CI).exit_code == 130
        monkeypatch.undo()
        run_id = checkpoint.read_info(partial_dir(out)).run_id
        released = _dplora("ledger", "record-release", run_id, "--db", str(db), "--signing-key", str(signing_key[0]))
        refused = _dplora("ledger", "settle", run_id, "--db", str(db))
        show = _dplora("ledger", "show", "--db", str(db))
        show_json = _dplora("ledger", "show", "--db", str(db), "--json")
        hook_fault_point(monkeypatch, "after-step", 1, sigterm)  # the new run: its set-up lines are what matter
        again = train(cfg, db, signing_key, "--overwrite", env=CI)
        monkeypatch.undo()
        assert again.exit_code == 130, again.output
        discarded = Ledger(db).charge(run_id)
        after = _dplora("ledger", "show", "--db", str(db), "--json")
        seen[k] = [
            released.exit_code,
            refused.exit_code,
            *(_public(r.output, root) for r in (released, refused, show, show_json, again, after)),
            (discarded.status, discarded.epsilon),
        ]
    assert seen[2] == seen[6]
    assert seen[2][:2] == [2, 2] and "discarded: its ledger charge is settled at its reserved" in seen[2][6]


# --- found, then fixed ------------------------------------------------------------------------------------------


def test_fixed_a_full_disk_in_a_checkpoint_write_names_no_size(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """ENOSPC while the checkpoint after step 2 or step 6 is written: the public outputs named the checkpoint's size
    (its header holds the step, ε after it and the private empty-step count; seen: 12104 vs 12112 bytes). Fixed: a
    disk-full line names no byte count."""

    def full():
        raise OSError(errno.ENOSPC, "No space left on device")

    seen = {}
    for k in (2, 6):
        cfg, out, db = _setup(tmp_path / f"k{k}", tiny_model_dir, tickets_csv)
        hook_fault_point(monkeypatch, "checkpoint-write", k, full)
        stopped = train(cfg, db, signing_key, "--json", env=CI)
        monkeypatch.undo()
        assert stopped.exit_code == 4, stopped.output
        seen[k] = (_needs(stopped.output), _needs((partial_dir(out) / "FAILED.json").read_text()))
    assert seen[2] == seen[6] == ([], [])


@LINUX_FDS
def test_fixed_a_full_disk_on_resume_names_no_size_of_the_steps_done(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """SIGTERM after step 2 or 6; the resumed run finds the disk full (docs say: resume "once there is free space";
    a quota with a little room left fails exactly this write). Its exit-4 line named "it needs N bytes" with N the
    size of the private metrics of the k steps done (e.g. 494 vs 1089 bytes): k = (N − header) / line size. Fixed:
    no byte count."""
    from dplora import atomic

    seen = {}
    for k in (2, 6):
        root = tmp_path / f"k{k}"
        cfg, out, db = _setup(root, tiny_model_dir, tickets_csv)
        hook_fault_point(monkeypatch, "after-step", k, sigterm)
        assert train(cfg, db, signing_key, env=CI).exit_code == 130
        monkeypatch.undo()
        monkeypatch.setattr(atomic, "os", _FullDisk(armed=True))
        resumed = train(cfg, db, signing_key, "--json", "--resume", env=CI)
        monkeypatch.undo()
        assert resumed.exit_code == 4, resumed.output
        failed = (partial_dir(out) / "FAILED.json").read_text()
        assert "disk full" in resumed.output and not _needs(resumed.output) and not _needs(failed)
        seen[k] = (_public(resumed.output, root), _public(failed, root))
    assert seen[2] == seen[6]


@LINUX_FDS
def test_fixed_a_full_disk_during_a_step_names_no_length_of_its_private_metrics_line(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    from dplora import atomic

    k = 3
    cfg, out, db = _setup(tmp_path / "run", tiny_model_dir, tickets_csv)
    disk = _FullDisk()
    monkeypatch.setattr(atomic, "os", disk)
    hook_fault_point(monkeypatch, "after-step", k, lambda: setattr(disk, "armed", True))  # full from step k+1 on
    stopped = train(cfg, db, signing_key, "--json", env=CI)
    monkeypatch.undo()
    assert stopped.exit_code == 4, stopped.output
    (line,) = disk.attempted
    private = json.loads(line)
    assert private["step"] == k + 1 and "train_loss" in private["not_covered_by_dp"]
    public = stopped.output + (partial_dir(out) / "FAILED.json").read_text()
    assert len(line) not in _needs(public) and _needs(public) == []


@pytest.mark.parametrize("where", ["held-out evaluation", "release signing"])
def test_fixed_a_signal_after_the_last_step_reads_as_one_before(
    where, tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    from dplora.recipe.train import DPLoRARecipe
    from dplora.release import report

    seen = {}
    for name in ("k6", where):
        root = tmp_path / name.replace(" ", "-")
        cfg, out, db = _setup(root, tiny_model_dir, tickets_csv)
        if name == "k6":
            hook_fault_point(monkeypatch, "after-step", 6, sigterm)
        elif name == "held-out evaluation":
            monkeypatch.setattr(DPLoRARecipe, "_evaluate_held_out", _signal_then(DPLoRARecipe._evaluate_held_out))
        else:
            monkeypatch.setattr(report, "sign", _signal_then(report.sign))
        stopped = train(cfg, db, signing_key, "--json", env=CI)
        monkeypatch.undo()
        assert stopped.exit_code == 130, stopped.output
        seen[name] = (_public(stopped.output, root), _public((partial_dir(out) / "FAILED.json").read_text(), root))
    assert seen["k6"] == seen[where]


def test_fixed_a_signal_while_publishing_is_held_until_the_release_is_in_place(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """A signal while the finished run was published (outside train()'s handler) printed 'training had not started,
    nothing was written' (false: the signed release and the checkpoint were in .partial, the charge pending). Fixed:
    the signal is held until the release is in place; the run ends as a finished run (exit 0, settled)."""
    root = tmp_path / "publish"
    cfg, out, db = _setup(root, tiny_model_dir, tickets_csv)
    monkeypatch.setattr(checkpoint, "discard", _signal_then(checkpoint.discard))
    finished = train(cfg, db, signing_key, "--json", env=CI)
    monkeypatch.undo()
    assert finished.exit_code == 0, finished.output
    assert "arrived while the finished run was published: the release is complete" in finished.output
    assert (out / "release.dsse.json").is_file() and not partial_dir(out).exists()
    assert Ledger(db).charges()[0].status == "settled"


def test_fixed_the_public_failed_json_and_partial_folder_carry_the_record_start(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """Out of host memory in step 4 (a failure that read no DP output). The private twin's "time" is the failure
    time; the public FAILED.json's and the .partial folder's mtimes are the same instant."""
    from dplora.run import loop

    real = loop.logical_step

    def step(spec, state, units):
        if state.step == 3:
            raise MemoryError()
        return real(spec, state, units)

    cfg, out, db = _setup(tmp_path / "run", tiny_model_dir, tickets_csv)
    monkeypatch.setattr(loop, "logical_step", step)
    stopped = train(cfg, db, signing_key, env=CI)
    monkeypatch.undo()
    assert stopped.exit_code == 4, stopped.output
    partial = partial_dir(out)
    private_time = dt.datetime.fromisoformat(json.loads((partial / "private" / "FAILED.json").read_text())["time"])
    started = dt.datetime.fromisoformat(checkpoint.read_info(partial).meta["started_at"])  # the record's started_at
    for public in (partial / "FAILED.json", partial):
        mtime = public.stat().st_mtime
        assert abs(mtime - private_time.timestamp()) > 2 or mtime == started.timestamp(), public
