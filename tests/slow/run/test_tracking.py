"""The slow tier of tests/run/test_tracking.py, whose docstring describes the module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import train_tiny

pytest.importorskip("tensorboard")


pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


PUBLIC_TAGS = {
    "dp/epsilon_spent",
    "dp/epsilon_planned",
    "dp/epsilon_target",
    "dp/delta",
    "dp/sigma",
    "dp/q",
    "dp/max_grad_norm",
    "dp/T",
}


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run,) = [p for p in folder.iterdir() if p.is_dir()]  # one log folder per run id
    acc = EventAccumulator(str(run))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _walltimes(folder: Path) -> list[tuple[int, float]]:
    """(step, wall time) of every public event of the one run in ``folder``, in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run,) = [p for p in folder.iterdir() if p.is_dir()]
    acc = EventAccumulator(str(run))
    acc.Reload()
    events = [(e.step, e.wall_time) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)]
    return sorted(set(events))


def _plan(out: Path) -> dict:
    from conftest import release_statement

    return release_statement(out)["predicate"]


def _all_files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_tensorboard_holds_the_plans_public_numbers_and_no_private_tag(
    tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, training={"report_to": "tensorboard"})
    assert result.exit_code == 0, result.output
    public = out.with_name(out.name + ".tracking") / "tensorboard"
    scalars = _scalars(public)
    assert set(scalars) == PUBLIC_TAGS  # no not_covered_by_dp/ tag, no loss
    record = _plan(out)
    acc = record["accounting"]
    steps = acc["steps_done"]
    assert steps == acc["steps_planned"] == 3
    metrics = [
        json.loads(ln) for ln in (out.with_name(out.name + ".private") / "metrics.jsonl").read_text().splitlines()
    ]
    curve = {m["step"]: m["epsilon_upper"] for m in metrics if "step" in m}
    assert [s for s, _ in scalars["dp/epsilon_spent"]] == list(range(1, steps + 1))
    walls = _walltimes(public)  # synthetic: start + step seconds, never each step's real (private) duration
    assert [w - walls[0][1] for _, w in walls] == [float(s) for s, _ in walls]
    for step, value in scalars["dp/epsilon_spent"]:
        assert value == pytest.approx(curve[step], rel=1e-6)  # float32 in the event file
    assert scalars["dp/epsilon_spent"][-1][1] == pytest.approx(acc["epsilon_spent"], rel=1e-6)
    assert scalars["dp/epsilon_target"] == [(0, pytest.approx(acc["target_epsilon"], rel=1e-6))]
    assert scalars["dp/delta"] == [(0, pytest.approx(acc["delta"], rel=1e-6))]
    assert scalars["dp/T"] == [(0, float(steps))]
    assert scalars["dp/sigma"] == [(0, pytest.approx(acc["noise_multiplier"], rel=1e-6))]
    assert scalars["dp/q"] == [(0, pytest.approx(acc["sample_rate"], rel=1e-6))]
    assert scalars["dp/max_grad_norm"] == [(0, pytest.approx(record["mechanism"]["max_grad_norm"], rel=1e-6))]
    assert not any("tensorboard" in f or "tfevents" in f for f in _all_files(out))  # nothing in the release
    private = out.with_name(out.name + ".private")
    assert not (private / "tensorboard").exists()
    # file metadata is public too (issue 40 item 6): a neutral name, the record's start as every time, no host/pid
    import datetime as dt
    import socket

    started = dt.datetime.fromisoformat(record["started_at"]).timestamp()
    (event_file,) = [p for p in public.rglob("*") if p.is_file()]
    assert event_file.name == f"events.out.tfevents.{int(started)}.dplora.0.0"
    assert socket.gethostname() not in event_file.name
    assert event_file.stat().st_mtime == started and walls[0][1] == started + walls[0][0]
    assert all(p.stat().st_mtime == started for p in out.rglob("*"))  # released files: the same public time


def test_private_diagnostics_only_when_asked_and_under_the_not_covered_prefix(
    tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    training = {"report_to": "tensorboard", "report_private": True}
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, training=training)
    assert result.exit_code == 0, result.output
    assert set(_scalars(out.with_name(out.name + ".tracking") / "tensorboard")) == PUBLIC_TAGS  # public stays public
    private = _scalars(out.with_name(out.name + ".private") / "tensorboard")
    assert set(private) == {
        "not_covered_by_dp/train_loss",
        "not_covered_by_dp/units",
        "not_covered_by_dp/records",
        "not_covered_by_dp/seconds_per_step",
    }
    metrics = [
        json.loads(ln) for ln in (out.with_name(out.name + ".private") / "metrics.jsonl").read_text().splitlines()
    ]
    records = {m["step"]: m["not_covered_by_dp"]["records"] for m in metrics if "step" in m}
    assert dict(private["not_covered_by_dp/records"]) == {s: float(r) for s, r in records.items()}
    assert not any("tfevents" in f for f in _all_files(out))
