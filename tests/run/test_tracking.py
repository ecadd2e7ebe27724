"""Experiment tracking (issue 32.2): TensorBoard event files, read back with tensorboard's EventAccumulator, hold the
plan's public numbers (values equal to the plan's) outside the release folder, and private diagnostics only with
training.report_private, under not_covered_by_dp/ in the private folder; a missing tracker library is exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import train_tiny

pytest.importorskip("tensorboard")


pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


@pytest.mark.parametrize("backend", ["wandb", "mlflow", "trackio"])
def test_a_tracker_not_installed_is_exit_2_before_anything_is_written(
    backend, tmp_path, tiny_model_dir, tickets_csv, signing_key, monkeypatch
):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == backend else real(name, *a))
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, training={"report_to": backend})
    assert result.exit_code == 2, result.output
    assert f"install {backend}" in result.output and "Traceback" not in result.output
    assert not out.exists() and not out.with_name(out.name + ".tracking").exists()


def test_report_to_refuses_an_unknown_backend():
    from conftest import contract_dict

    from dplora.contract.loader import parse_contract
    from dplora.errors import BadInputError

    raw = contract_dict(Path("m"), Path("d.csv"), Path("o"), privacy={"num_units": 100}, training={"report_to": "x"})
    with pytest.raises(BadInputError, match="training.report_to"):
        parse_contract(raw)


class _FakeRemote:
    """Stands in for an accelerate tracker: records how it was made and what it was sent."""

    made: list = []

    def __init__(self, run_name, **kwargs):
        self.logged, self.finished = [], False
        _FakeRemote.made.append((run_name, kwargs, self))

    def start(self):
        pass

    def log(self, values, step):
        self.logged.append((step, dict(values)))

    def finish(self):
        self.finished = True


def _fake_plan():
    import types

    curve = {1: 0.5, 2: 0.8}
    return types.SimpleNamespace(
        epsilon=0.8,
        target_epsilon=1.0,
        delta=1e-5,
        noise_multiplier=1.3,
        sample_rate=0.01,
        max_grad_norm=1.0,
        steps=2,
        epsilon_at=curve.__getitem__,
    )


@pytest.mark.parametrize("report_private", [False, True])
def test_wandb_goes_through_accelerate_with_console_off_and_public_tags_only(monkeypatch, tmp_path, report_private):
    import importlib.util
    import sys
    import types

    import accelerate.tracking

    from dplora.run.tracking import Tracker

    settings = []
    fake_wandb = types.ModuleType("wandb")
    fake_wandb.Settings = lambda **kw: settings.append(kw) or ("settings", kw)
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "wandb" else real(name, *a))
    monkeypatch.setattr(accelerate.tracking, "WandBTracker", _FakeRemote)
    _FakeRemote.made.clear()
    tracker = Tracker(
        "wandb",
        plan=_fake_plan(),
        out=tmp_path / "run",
        private_dir=tmp_path,
        run_id="r1",
        report_private=report_private,
    )
    for step in (1, 2):
        line = {"step": step, "seconds": 0.2, "not_covered_by_dp": {"train_loss": 3.0, "units": 4, "records": 5}}
        tracker.log_step(line)
    # without private numbers the server hears of the run only at close: it never sees the run's start
    assert len(_FakeRemote.made) == (1 if report_private else 0)
    # before close: a server stamps arrival times, so no public number is sent per step
    live = list(_FakeRemote.made[0][2].logged) if report_private else []
    assert all(not any(k.startswith("dp/") for k in values) for _, values in live)
    tracker.close()
    ((name, kwargs, remote),) = _FakeRemote.made
    assert settings == [{"console": "off"}] and kwargs["settings"] == ("settings", {"console": "off"})
    assert remote.finished and name == "run"
    public = remote.logged[len(live) :]
    step0 = public[0]
    assert step0 == (
        0,
        {
            "dp/epsilon_planned": 0.8,
            "dp/epsilon_target": 1.0,
            "dp/delta": 1e-5,
            "dp/sigma": 1.3,
            "dp/q": 0.01,
            "dp/max_grad_norm": 1.0,
            "dp/T": 2.0,
        },
    )
    private = {
        "not_covered_by_dp/train_loss": 3.0,
        "not_covered_by_dp/units": 4.0,
        "not_covered_by_dp/records": 5.0,
        "not_covered_by_dp/seconds_per_step": 0.2,
    }
    assert public[1:] == [(1, {"dp/epsilon_spent": 0.5}), (2, {"dp/epsilon_spent": 0.8})]
    assert live == ([(1, private), (2, private)] if report_private else [])
