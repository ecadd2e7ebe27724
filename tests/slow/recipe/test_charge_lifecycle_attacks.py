"""Attacks on a run's charge lifecycle through the compile/run/report structure (against the phases of dfe6f03).

The restructure compiles the contract once (``recipe.config.compile_run`` → ``run.config.RunConfig``), runs one
recipe (``recipe.train.DPLoRARecipe``: setup → train → release; ranks other than 0 in ``recipe.follower``), owns the
ledger charge in one object (``ledger.charge.RunCharge``) and writes the record, the card and ``train --json`` from
one set of public facts (``release.report``). Clip guidance measures through a σ = 0 ``plan.training.measurement_twin``.

Each attack below tries an input (contract, CLI flags, interruption, a second run over the same folder) against a
guarantee that held at dfe6f03:

1. the ledger: charged before the first private step; a failed run settled at ε of the accountant's steps, a
   resumable one kept pending; ``--overwrite`` settles the discarded charge; a control is never charged without a
   population, refused on one without ``--non-private`` and charged ∞ with it; a sweep trial is no release;
2. the control switch: a DP contract never runs with σ = 0 (the measurement twin, compile_run, the follower);
3. ``train --json`` (``RunResult.summary``) holds public fields only;
4. no release without every planned step accounted;
5. resume: same run id, the public warm start not redone, a changed contract refused.

``test_held_*``: the attack failed (the guarantee holds; kept as a regression). One gap the pass found had failed
the same way at dfe6f03 (a control without population over a DP run's folder with ``--overwrite`` left the discarded
charge pending): fixed, its test now asserts the charge is settled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import contract_dict, release_statement, write_contract
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.contract.loader import parse_contract
from dplora.ledger.store import Ledger
from dplora.run import checkpoint
from dplora.run import loop as loop_mod

runner = CliRunner()
POP = "tickets"
T = 4

# train --json before the restructure (dfe6f03 dplora/cli/train.py::_train_summary): every key public by construction
PUBLIC_SUMMARY_KEYS = {
    "ok", "run_id", "differentially_private", "protected_unit", "unit_key", "adjacency", "num_units",
    "num_units_source", "expected_batch_size", "sample_rate", "steps", "steps_done", "noise_multiplier",
    "max_grad_norm", "epsilon_spent", "target_epsilon", "delta", "accountant", "accountant_version", "paths",
    "threads",
}  # fmt: skip
# what a run computes on the private data (RunResult and <output_dir>.private/report.json): never in train --json
PRIVATE_NAMES = ("empty_steps", "seconds", "records_zeroed", "peak_memory", "eval", "loss", "records", "units_seen")


def _ledger(tmp_path: Path, name: str = "ledger") -> Path:
    """A ledger with population ``tickets`` (row level, add/remove) and a cap far above the tiny runs' ε."""
    db = tmp_path / f"{name}.sqlite3"
    with Ledger(db) as led:
        led.set_cap(POP, epsilon_max="1000", delta_max="1e-3", protected_unit="row", adjacency="add_remove")
    return db


def _raw(tmp_path, model_dir, data, name="run", privacy=None, data_section=None, **training):
    return contract_dict(
        model_dir,
        data,
        tmp_path / name,
        privacy=privacy or {},
        data=data_section or {},
        training={"steps": T, "checkpoint_every": 1, **training},
    )


def _train(tmp_path: Path, raw: dict, signing_key, db: Path, *extra: str, cfg_name: str = "run"):
    cfg = write_contract(tmp_path / f"{cfg_name}.yaml", raw)
    args = ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress", "--ledger", str(db), *extra]
    return runner.invoke(app, args)


def _interrupted(tmp_path, raw, signing_key, db, step: int = 2, *extra: str):
    """Run ``raw`` and SIGTERM it after ``step`` (a resume checkpoint of that step is written, exit 130)."""

    def hook(point, s):
        if (point, s) == ("after-step", step):
            os.kill(os.getpid(), signal.SIGTERM)

    with checkpoint.fault_hook(hook):
        result = _train(tmp_path, raw, signing_key, db, *extra)
    assert result.exit_code == 130, result.output
    return result


def _partial(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def _releases_on_disk(root: Path) -> list[Path]:
    return sorted(root.rglob("release.dsse.json"))


def _no_private_names(doc, where="") -> None:
    if isinstance(doc, dict):
        for key, value in doc.items():
            assert not any(name in key for name in PRIVATE_NAMES), f"{where}{key} in train --json"
            _no_private_names(value, f"{where}{key}.")


def _plan_of(raw: dict):
    """The plan train makes for ``raw`` (a declared N: no data read; calibration is deterministic)."""
    from dplora.plan.resolve import plan_for

    return plan_for(parse_contract(raw), None)


# ------------------------------------------------------------------------------------------------------------------
# 2. The control switch: σ = 0 never reaches a DP contract's steps
# ------------------------------------------------------------------------------------------------------------------


def test_held_the_measurement_twin_and_the_control_plan_never_make_a_private_step(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv
):
    """A DP contract compiled with the clip-guide's σ = 0 twin (or with a control plan) keeps ``private=True`` (no
    option flips it, not even ``non_private``) and so cannot make its mechanism: ``RunConfig.mechanism()`` and
    ``make_mechanism`` refuse, ``build_run`` fails in setup and the follower never reaches a step. The same DP
    contract with its real plan gets σ > 0 and a DP-SGD event; only ``privacy.enabled: false`` gives σ = 0."""
    from dplora.data import units as data_mod
    from dplora.engine import distributed
    from dplora.errors import TrainingFailedError
    from dplora.mechanism.core import make_mechanism
    from dplora.mechanism.flags import PerformanceFlags
    from dplora.plan.training import control_plan, measurement_twin
    from dplora.recipe.build import build_run
    from dplora.recipe.config import RunOptions, compile_run
    from dplora.recipe.follower import follow
    from dplora.surface import PrivateLog

    raw = _raw(tmp_path, tiny_model_dir, tickets_csv)
    contract = parse_contract(raw)
    plan = _plan_of(raw)
    assert plan.noise_multiplier > 0

    twin = measurement_twin(contract.privacy, 16)
    assert twin.noise_multiplier == 0 and twin.epsilon == float("inf")
    for options in (RunOptions(), RunOptions(non_private=True, tuning_trial=True, ledger_release=False)):
        config = compile_run(contract, twin, options)
        assert config.private is True  # the switch comes from the contract only
        with pytest.raises(ValueError, match="noise_multiplier > 0"):
            config.mechanism()
    for bad in (twin, control_plan(plan)):
        with pytest.raises(ValueError):
            make_mechanism(bad, PerformanceFlags(), distributed.SINGLE, private=True)

    dp = compile_run(contract, plan, RunOptions(non_private=True)).mechanism()
    assert dp.private and dp.event.noise_multiplier == plan.noise_multiplier > 0 and dp.noise_variance > 0
    ctrl_contract = parse_contract(_raw(tmp_path, tiny_model_dir, tickets_csv, privacy={"enabled": False}))
    ctrl = compile_run(ctrl_contract, plan, RunOptions()).mechanism()
    assert not ctrl.private and ctrl.plan.noise_multiplier == 0.0 and ctrl.plan.epsilon == float("inf")

    # the twin through the training path: rank 0's build and a follower both stop in setup, before any step
    stepped = []  # every fault point the run passes (a step, a checkpoint write, the loop's start)
    with checkpoint.fault_hook(lambda point, s: stepped.append((point, s))):
        table, _ = data_mod.load_split(contract.data, unit_key=contract.privacy.unit_key, seed=0)
        index = data_mod.build_unit_index(table, contract.privacy, seed=0)
        config = compile_run(contract, twin, RunOptions())
        with pytest.raises(TrainingFailedError, match="setting up per-sample gradients"):
            build_run(config, contract.data, table, index, out=tmp_path / "run", staging=None, log=lambda *_: None)
        io = SimpleNamespace(options=RunOptions(), log=lambda *_: None, private=PrivateLog())
        with pytest.raises(TrainingFailedError, match="setting up per-sample gradients"):
            follow(config, contract.data, table, index, out=tmp_path / "run", io=io)
    assert stepped == []


# ------------------------------------------------------------------------------------------------------------------
# 1 + 3. The ledger's order and train --json
# ------------------------------------------------------------------------------------------------------------------


def test_held_a_dp_run_is_charged_before_its_first_private_step_and_released_once(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """The charge is reserved before the first logical step on the private data, settled after the last one, and
    the release recorded once, after the settlement, with the sha256 of the signed envelope. ``train --json`` (now
    ``RunResult.summary`` from ``release.report``) has exactly the public keys it had at dfe6f03, no private count
    or timing, and agrees with the signed record and the ledger."""
    events: list[str] = []
    for name in ("reserve", "settle", "record_release", "reserve_non_private"):
        real = getattr(Ledger, name)

        def spy(self, *a, _real=real, _name=name, **k):
            events.append(_name)
            return _real(self, *a, **k)

        monkeypatch.setattr(Ledger, name, spy)

    def step(point, s):
        if point == "after-step":
            events.append("step")

    db = _ledger(tmp_path)
    raw = _raw(tmp_path, tiny_model_dir, tickets_csv, privacy={"population": POP})
    with checkpoint.fault_hook(step):
        result = _train(tmp_path, raw, signing_key, db, "--json")
    assert result.exit_code == 0, result.output
    assert events == ["reserve", *["step"] * T, "settle", "record_release"]

    summary = json.loads(result.stdout)
    assert set(summary) == PUBLIC_SUMMARY_KEYS
    _no_private_names(summary)
    record = release_statement(tmp_path / "run")["predicate"]
    (charge,) = Ledger(db).charges()
    (release,) = Ledger(db).releases()
    assert summary["run_id"] == record["run_id"] == charge.run_id == release["run_id"]
    assert summary["differentially_private"] is True and summary["steps_done"] == T
    assert summary["epsilon_spent"] == record["accounting"]["epsilon_spent"] == float(charge.epsilon)
    assert charge.status == "settled" and charge.purpose == "release"
    envelope = tmp_path / "run" / "release.dsse.json"
    assert release["record_sha256"] == hashlib.sha256(envelope.read_bytes()).hexdigest()


def test_held_a_failed_run_without_a_checkpoint_is_settled_at_the_accountants_steps(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """No resume checkpoint (its writes are dropped) and a failure inside step 3: exit 4, no release, and the charge
    is settled as failed at ε after the 2 accounted steps (not 0, not pending)."""
    monkeypatch.setattr(checkpoint.Checkpointer, "write", lambda self: None)

    def step(point, s):
        if (point, s) == ("after-step", 2):
            raise RuntimeError("planted failure before step 3")

    db = _ledger(tmp_path)
    raw = _raw(tmp_path, tiny_model_dir, tickets_csv, privacy={"population": POP})
    with checkpoint.fault_hook(step):
        result = _train(tmp_path, raw, signing_key, db)
    assert result.exit_code == 4, result.output
    assert _releases_on_disk(tmp_path) == [] and not (tmp_path / "run").exists()
    (charge,) = Ledger(db).charges()
    eps2 = _plan_of(raw).epsilon_at(2)
    assert charge.status == "failed" and float(charge.epsilon) == pytest.approx(eps2) and eps2 > 0
    assert Ledger(db).releases() == []


# ------------------------------------------------------------------------------------------------------------------
# 1 + 5. Interruption, resume and --overwrite
# ------------------------------------------------------------------------------------------------------------------


def test_held_an_interrupted_run_stays_pending_and_resumes_as_itself(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """SIGTERM after step 2: the charge stays pending; ``--resume`` under another target ε is refused (exit 2, the
    checkpoint and the charge untouched); ``--resume`` then finishes the same run id without redoing the public
    warm start (the record keeps its entry), with one charge, settled, and one release."""
    from dplora.data.demo import write_tickets
    from dplora.engine import warmstart

    public = tmp_path / "public.csv"
    write_tickets(public, num_tickets=16, seed=7)
    calls = []
    real_warm = warmstart.warm_start

    def warm(*a, **k):
        calls.append(1)
        return real_warm(*a, **k)

    monkeypatch.setattr(warmstart, "warm_start", warm)
    db = _ledger(tmp_path)
    data = {"public_warm_start": {"path": str(public), "steps": 2, "batch_size": 4}}
    raw = _raw(tmp_path, tiny_model_dir, tickets_csv, privacy={"population": POP}, data_section=data)
    _interrupted(tmp_path, raw, signing_key, db)
    info = checkpoint.read_info(_partial(tmp_path / "run"))
    (charge,) = Ledger(db).charges()
    assert charge.run_id == info.run_id and charge.status == "pending" and len(calls) == 1

    changed = _train(tmp_path, raw, signing_key, db, "--resume", "privacy.target_epsilon=4.0")
    assert changed.exit_code == 2 and "privacy.target_epsilon" in changed.output, changed.output
    assert checkpoint.read_info(_partial(tmp_path / "run")).step == info.step
    assert Ledger(db).charge(info.run_id).status == "pending"

    resumed = _train(tmp_path, raw, signing_key, db, "--resume", "--json")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["run_id"] == info.run_id and len(calls) == 1
    record = release_statement(tmp_path / "run")["predicate"]
    assert record["run_id"] == info.run_id and record["accounting"]["steps_done"] == T
    assert record["public_warm_start"]["sha256"] == hashlib.sha256(public.read_bytes()).hexdigest()
    (charge,) = Ledger(db).charges()
    assert charge.status == "settled" and [r["run_id"] for r in Ledger(db).releases()] == [info.run_id]


def test_held_a_control_overwriting_a_dp_folder_on_the_population_settles_the_discarded_charge(
    tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    """A DP run on the population stopped after step 2 (pending), then a control on the same population and folder
    with ``--overwrite``: refused without ``--non-private`` before anything is discarded; with it the discarded DP
    charge is settled as failed at no less than ε of its checkpoint (never below what was spent, never pending),
    the control is charged ε = ∞ and settled, and the control is never recorded as a release."""
    db = _ledger(tmp_path)
    _interrupted(tmp_path, _raw(tmp_path, tiny_model_dir, tickets_csv, privacy={"population": POP}), signing_key, db)
    info = checkpoint.read_info(_partial(tmp_path / "run"))
    ctrl = _raw(tmp_path, tiny_model_dir, tickets_csv, privacy={"population": POP, "enabled": False})

    refused = _train(tmp_path, ctrl, signing_key, db, "--overwrite")
    assert refused.exit_code == 2 and "--non-private" in refused.output, refused.output
    assert checkpoint.read_info(_partial(tmp_path / "run")).run_id == info.run_id
    assert [c.status for c in Ledger(db).charges()] == ["pending"]

    result = _train(tmp_path, ctrl, signing_key, db, "--overwrite", "--non-private", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["differentially_private"] is False and set(summary) == PUBLIC_SUMMARY_KEYS
    charges = {c.run_id: c for c in Ledger(db).charges()}
    discarded, control = charges.pop(info.run_id), charges.pop(summary["run_id"])
    assert charges == {}
    assert discarded.status == "failed" and info.meta["epsilon_upper"] <= float(discarded.epsilon)
    assert float(discarded.epsilon) <= float(discarded.reserved_epsilon)
    assert control.status == "settled" and str(control.epsilon) == "Infinity" and control.population == POP
    assert Ledger(db).releases() == []


def test_held_a_control_without_population_is_never_charged(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """``privacy.enabled: false`` without a population: trains, writes its non-private record, and never creates or
    opens the ledger it is pointed at."""
    db = tmp_path / "never.sqlite3"
    raw = _raw(tmp_path, tiny_model_dir, tickets_csv, privacy={"enabled": False})
    result = _train(tmp_path, raw, signing_key, db, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["differentially_private"] is False
    assert release_statement(tmp_path / "run")["predicateType"].endswith("/non-private/v1")
    assert not list(tmp_path.glob("never.sqlite3*"))


def test_held_a_sweep_trial_is_charged_as_tuning_and_never_recorded_as_a_release(
    tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    """``ledger_release=False`` (a ``dplora sweep`` trial) with ``tuning_trial``: charged and settled like any run,
    as purpose ``tuning``, and no release is recorded; its ``RunResult.summary`` is the public summary."""
    from dplora.recipe.config import RunOptions
    from dplora.recipe.train import run_training

    db = _ledger(tmp_path)
    contract = parse_contract(_raw(tmp_path, tiny_model_dir, tickets_csv, privacy={"population": POP}))
    options = RunOptions(
        signing_key=signing_key[0], ledger_path=db, progress=False, tuning_trial=True, ledger_release=False
    )
    result = run_training(contract, options, log=lambda *_: None)
    (charge,) = Ledger(db).charges()
    assert charge.run_id == result.run_id and charge.purpose == "tuning" and charge.status == "settled"
    assert float(charge.epsilon) == result.epsilon_spent and Ledger(db).releases() == []
    assert set(result.summary) == PUBLIC_SUMMARY_KEYS
    _no_private_names(result.summary)
    from dplora.release.report import PublicFacts

    assert not {f.name for f in dataclasses.fields(PublicFacts)} & {
        "empty_steps", "seconds", "seconds_per_step", "eval_seconds", "records_zeroed", "peak_memory_gib",
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------------------------
# 4. No release unless every planned step was accounted
# ------------------------------------------------------------------------------------------------------------------


def test_held_a_loop_that_stops_one_step_short_never_releases(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """A loop that returns after T - 1 steps (as a broken stop rule would): ``check_accounted`` refuses before any
    record is signed (exit 4), nothing is published and no release is recorded; the charge is kept (pending: the
    run holds a resume checkpoint)."""
    real_run = loop_mod.run_steps

    def short(spec, state, **kw):
        plan = dataclasses.replace(spec.plan, steps=spec.plan.steps - 1)
        real_run(dataclasses.replace(spec, config=dataclasses.replace(spec.config, plan=plan)), state, **kw)

    monkeypatch.setattr(loop_mod, "run_steps", short)
    db = _ledger(tmp_path)
    result = _train(tmp_path, _raw(tmp_path, tiny_model_dir, tickets_csv, privacy={"population": POP}), signing_key, db)
    assert result.exit_code == 4, result.output
    assert _releases_on_disk(tmp_path) == [] and not (tmp_path / "run").exists()
    (charge,) = Ledger(db).charges()
    assert charge.status == "pending" and Ledger(db).releases() == []


# ------------------------------------------------------------------------------------------------------------------
# Gap (pre-existing at dfe6f03): a control without population over a DP run's resumable folder
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def control_overwrites_unassigned(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    """A DP run without population stopped after step 2 (an unassigned pending charge), then a control without
    population over the same folder with ``--overwrite``: (the checkpoint's info, the ledger, the control's exit)."""
    tmp = tmp_path_factory.mktemp("gap")
    db = tmp / "ledger.sqlite3"
    _interrupted(tmp, _raw(tmp, tiny_model_dir, tickets_csv), signing_key, db)
    info = checkpoint.read_info(_partial(tmp / "run"))
    result = _train(
        tmp, _raw(tmp, tiny_model_dir, tickets_csv, privacy={"enabled": False}), signing_key, db, "--overwrite"
    )
    return info, db, result


def test_held_the_discarded_unassigned_charge_is_never_below_what_was_spent(control_overwrites_unassigned):
    """Whatever the control does with it, the discarded DP charge stays at least ε of its checkpoint's steps."""
    info, db, result = control_overwrites_unassigned
    assert result.exit_code == 0, result.output
    (charge,) = Ledger(db).unassigned()
    assert charge.run_id == info.run_id
    assert float(charge.epsilon) >= info.meta["epsilon_upper"] and charge.status in ("pending", "failed")


def test_a_control_without_population_overwriting_a_dp_folder_settles_its_charge(
    control_overwrites_unassigned,
):
    """The checkpoint is deleted with the folder, and the DP run's charge is settled (it was left pending at its
    reservation before: a control without population opened no ledger to settle it in)."""
    info, db, result = control_overwrites_unassigned
    assert result.exit_code == 0, result.output
    assert not info.path.exists()  # the discarded checkpoint is gone with its folder
    assert Ledger(db).charge(info.run_id).status != "pending"
