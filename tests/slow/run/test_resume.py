"""The slow tier of tests/run/test_resume.py, whose docstring describes the module."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import contract_dict, release_statement, write_contract
from support.resume import T, hook_fault_point, partial_dir, runner, setup, sigterm, train

from dplora.cli.app import app
from dplora.ledger.store import Ledger
from dplora.run import checkpoint

ROOT = Path(__file__).resolve().parents[3]


def _record(out: Path) -> dict:
    return release_statement(out)["predicate"]


def _metric_steps(out: Path) -> list:
    lines = [json.loads(ln) for ln in (out.with_name(out.name + ".private") / "metrics.jsonl").read_text().splitlines()]
    return [m.get("step", m.get("resumed_at_step") and f"resumed@{m['resumed_at_step']}") for m in lines[1:]]


def _error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    """An uninterrupted run of the same contract: its record."""
    tmp = tmp_path_factory.mktemp("reference")
    cfg, out, db = setup(tmp, tiny_model_dir, tickets_csv, "ref")
    result = train(cfg, db, signing_key)
    assert result.exit_code == 0, result.output
    return _record(out)


KILLS = {  # name: (fault point, the step the resume starts from)
    "early": ("after-step:1", 0),
    "middle": ("after-step:5", 4),
    "during a checkpoint write": ("checkpoint-write:6", 4),
}


def test_sigkill_at_three_points_then_resume_matches_an_uninterrupted_run(
    tmp_path, tiny_model_dir, tickets_csv, signing_key, reference
):
    """kill -9 early, mid-run and mid-checkpoint-write; --resume gives the same T, ε and accounted steps as an
    uninterrupted run, finite adapters, and exactly one (settled) ledger charge."""
    from safetensors.torch import load_file

    runs, procs = {}, {}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for i, (name, (fault, _)) in enumerate(KILLS.items()):
        cfg, out, db = setup(tmp_path, tiny_model_dir, tickets_csv, f"kill{i}")
        runs[name] = (cfg, out, db)
        args = [sys.executable, "-m", "dplora", "train", str(cfg), "--signing-key", str(signing_key[0])]
        args += ["--no-progress", "--ledger", str(db)]
        procs[name] = subprocess.Popen(
            args, env=env | {checkpoint.FAULT_ENV: fault}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
    for name, proc in procs.items():
        output = proc.communicate(timeout=300)[0].decode()
        assert proc.returncode == -signal.SIGKILL, f"{name}: {output}"
    for name, (cfg, out, db) in runs.items():
        start = KILLS[name][1]
        partial = partial_dir(out)
        info = checkpoint.read_info(partial)
        assert info.step == info.accounted_steps == start, name
        assert not out.exists() and not (partial / "release.dsse.json").exists()
        if name == "during a checkpoint write":
            (tmp,) = partial.glob(".resume.*.tmp")  # the half-written file; the previous checkpoint is intact
            assert 0 < tmp.stat().st_size < info.path.stat().st_size
        (charge,) = Ledger(db).charges()
        assert charge.status == "pending" and charge.run_id == info.run_id
        result = train(cfg, db, signing_key, "--resume")
        assert result.exit_code == 0, f"{name}: {result.output}"
        assert "from its checkpoint;" in result.output and f"step {start}/" not in result.output
        rec = _record(out)
        for key in ("steps_planned", "steps_done", "epsilon_spent", "noise_multiplier", "sample_rate"):
            assert rec["accounting"][key] == reference["accounting"][key], (name, key)
        assert rec["accounting"]["steps_done"] == T and rec["run_id"] == info.run_id
        steps = _metric_steps(out)  # every step applied exactly once, the lost ones redone after the resume
        assert [s for s in steps if isinstance(s, int)] == list(range(1, T + 1)), (name, steps)
        assert f"resumed@{start}" in steps or start == 0
        tensors = load_file(out / "adapter" / "adapter_model.safetensors")
        assert tensors and all(t.isfinite().all() for t in tensors.values())
        (charge,) = Ledger(db).charges()  # one charge per run: the resume settled the original reservation
        assert charge.status == "settled" and float(charge.epsilon) == reference["accounting"]["epsilon_spent"]
        assert not (out / checkpoint.CHECKPOINT_FILENAME).exists() and not partial.exists()
        assert not list(out.glob(".resume.*"))
        check = runner.invoke(app, ["verify", str(out), "--public-key", str(signing_key[1])])
        assert check.exit_code == 0, check.output


def test_sigterm_writes_a_checkpoint_and_resume_finishes(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """SIGTERM at step 3 (checkpoints every 4): a checkpoint of step 3 exists, no release, exit 130 with a
    one-line resume hint; --resume finishes from step 3."""
    cfg, out, db = setup(tmp_path, tiny_model_dir, tickets_csv, "term", checkpoint_every=4)
    hook_fault_point(monkeypatch, "after-step", 3, sigterm)
    result = train(cfg, db, signing_key)
    assert result.exit_code == 130, result.output
    (line,) = _error_lines(result.output)
    assert line.startswith(
        f"error: interrupted (SIGTERM); no release was written; see {partial_dir(out) / 'FAILED.json'}"
    )
    assert "step 3" not in line and "--resume" in line  # the step a signal reached is never public
    assert checkpoint.read_info(partial_dir(out)).step == 3
    assert not out.exists() and not list(tmp_path.rglob("release.dsse.json"))
    failed = json.loads((partial_dir(out) / "FAILED.json").read_text())
    assert failed["reason"] == "interrupted (SIGTERM)" and failed["steps_planned"] == T and "steps_done" not in failed
    assert "3" not in json.dumps({k: v for k, v in failed.items() if k not in ("run_id", "epsilon_reserved")})
    private = json.loads((partial_dir(out) / "private" / "FAILED.json").read_text())
    assert private["resume_checkpoint"]["step"] == 3 and private["steps_done"] == 3
    monkeypatch.undo()
    result = train(cfg, db, signing_key, "--resume")
    assert result.exit_code == 0, result.output
    assert "from its checkpoint;" in result.output and "step 3/8" not in result.output
    assert _record(out)["accounting"]["steps_done"] == T
    assert _metric_steps(out) == [1, 2, 3, "resumed@3", 4, 5, 6, 7, 8]
    assert not (out / "FAILED.json").exists()
    (charge,) = Ledger(db).charges()
    assert charge.status == "settled"


def test_checkpoint_holds_no_generator_or_sampler_state(tmp_path, monkeypatch, tiny_model_dir, tickets_csv):
    """Inspect every checkpoint as written: only LoRA and optimizer tensors; neither the noise generator's
    ChaCha20 key nor the Poisson sampler's PCG64 state appears anywhere in the file's bytes."""
    from safetensors import safe_open

    from dplora.contract.loader import parse_contract
    from dplora.recipe.config import RunOptions
    from dplora.recipe.train import run_training

    samplers = []

    from dplora.mechanism import sampling  # the run's sampler is the mechanism's

    class RecordingSampler(sampling.PoissonUnitSampler):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            samplers.append(self)

    seen = []
    real_write = checkpoint.write

    def spy_write(spec, state, **kw):
        info = real_write(spec, state, **kw)
        gen_state = state.optimizer.generator._key  # the 256-bit ChaCha20 key (dplora.mechanism.noise.CsprngGaussian)
        pcg = samplers[-1]._rng.bit_generator.state["state"] if samplers else None
        seen.append((info.path.read_bytes(), gen_state, pcg, info))
        return info

    monkeypatch.setattr(sampling, "PoissonUnitSampler", RecordingSampler)
    monkeypatch.setattr(checkpoint, "write", spy_write)
    raw = contract_dict(tiny_model_dir, tickets_csv, tmp_path / "run", training={"steps": 4, "checkpoint_every": 2})
    contract = parse_contract(raw)
    key = tmp_path / "k.key"
    from dplora.release.keys import generate_keypair

    generate_keypair(key)
    run_training(contract, RunOptions(signing_key=key, data_key=None, progress=False), log=lambda *_: None)
    assert [s[3].step for s in seen] == [0, 2, 4]
    for blob, gen_state, pcg, info in seen:
        assert len(gen_state) == 32
        for form in (gen_state, gen_state.hex().encode(), gen_state.hex().upper().encode()):
            assert form not in blob and form[:16] not in blob
        if pcg is not None:
            for value in (pcg["state"], pcg["inc"]):
                assert value.to_bytes(16, "little") not in blob and str(value).encode() not in blob
        path = tmp_path / "inspect.safetensors"
        path.write_bytes(blob)
        with safe_open(path, framework="np") as fh:
            names = list(fh.keys())
            meta = json.loads(fh.metadata()["dplora"])
        assert names and all(n.startswith(("adapter.", "optimizer.")) for n in names)
        assert sum(n.startswith("adapter.") for n in names) == 8  # q_proj, v_proj × A, B × 2 layers
        assert set(meta) == {
            "format", "run_id", "step", "empty_steps", "accountant_history", "epsilon_upper", "plan",
            "contract_yaml", "contract_sha256", "data", "optimizer", "adapter_config", "execution",
            "started_at", "written_at", "not_stored", "tokenization",
        }  # fmt: skip
        assert not any(w in json.dumps(meta["optimizer"]).lower() for w in ("generator", "rng", "sampler"))
        sigma_q = [meta["plan"]["noise_multiplier"], meta["plan"]["sample_rate"]]
        assert meta["accountant_history"] == ([[*sigma_q, info.step]] if info.step else [])


def test_full_disk_during_a_checkpoint_stops_cleanly(tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key):
    """ENOSPC in the middle of the step-4 checkpoint: exit 4, one line, the step-2 checkpoint and FAILED.json
    stay, no temporary file, no release; the charge stays pending for the resume."""

    def full():
        raise OSError(errno.ENOSPC, "No space left on device")

    cfg, out, db = setup(tmp_path, tiny_model_dir, tickets_csv, "disk")
    hook_fault_point(monkeypatch, "checkpoint-write", 4, full)
    result = train(cfg, db, signing_key)
    assert result.exit_code == 4, result.output
    (line,) = _error_lines(result.output)
    assert "Traceback" not in result.output
    assert "disk full" in line and checkpoint.CHECKPOINT_FILENAME in line and "--resume" in line
    assert "step 2" not in line and "a resume checkpoint is in" in line
    partial = partial_dir(out)
    assert checkpoint.read_info(partial).step == 2 and not list(partial.glob(".resume.*"))
    failed = json.loads((partial / "FAILED.json").read_text())
    assert failed["release"].startswith("none") and "steps_done" not in failed
    assert failed["reason"].startswith("disk full writing ")
    assert checkpoint.CHECKPOINT_FILENAME in failed["reason"] and "free space in" in failed["reason"]
    private = json.loads((partial / "private" / "FAILED.json").read_text())
    assert private["resume_checkpoint"]["step"] == 2 and private["steps_done"] == 4
    assert not out.exists() and not list(tmp_path.rglob("release.dsse.json"))
    assert Ledger(db).charges()[0].status == "pending"


OOMS = {
    "accelerator": lambda: __import__("torch").OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    "host": lambda: MemoryError(),
}


@pytest.mark.parametrize("kind", sorted(OOMS))
def test_out_of_memory_stops_cleanly_and_resumes(kind, tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key):
    """Out of memory in step 5: exit 4, one line naming it and the resume (smaller physical batch); the step-4
    checkpoint and FAILED.json stay; --resume with training.physical_batch_size=2 finishes with one charge."""
    from dplora.run import loop as run_mod

    real_step = run_mod.logical_step

    def step(spec, state, units):
        if state.step == 4:
            raise OOMS[kind]()
        return real_step(spec, state, units)

    monkeypatch.setattr(run_mod, "logical_step", step)
    cfg, out, db = setup(tmp_path, tiny_model_dir, tickets_csv, "oom")
    result = train(cfg, db, signing_key)
    assert result.exit_code == 4, result.output
    (line,) = _error_lines(result.output)
    assert f"out of {kind} memory during training" in line and "physical_batch_size" in line and "--resume" in line
    assert "step" not in line.split("; no release")[0]
    assert "Traceback" not in result.output
    assert checkpoint.read_info(partial_dir(out)).step == 4
    assert json.loads((partial_dir(out) / "private" / "FAILED.json").read_text())["resume_checkpoint"]["step"] == 4
    monkeypatch.undo()
    result = train(cfg, db, signing_key, "--resume", "training.physical_batch_size=2")
    assert result.exit_code == 0, result.output
    assert _record(out)["accounting"]["steps_done"] == T
    assert [c.status for c in Ledger(db).charges()] == ["settled"]


def test_settle_refuses_a_resumable_run_and_abandon_charges_its_checkpoint(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """ledger show lists the pending charge with its age; settle refuses while a checkpoint can be resumed;
    --abandon charges the reserved ε (never ε at the step a signal reached); resume is then refused; a rerun needs
    --overwrite."""
    cfg, out, db = setup(tmp_path, tiny_model_dir, tickets_csv, "settle", checkpoint_every=4)
    hook_fault_point(monkeypatch, "after-step", 3, sigterm)
    assert train(cfg, db, signing_key).exit_code == 130
    monkeypatch.undo()
    run_id = checkpoint.read_info(partial_dir(out)).run_id
    shown = runner.invoke(app, ["ledger", "show", "--db", str(db), "--json"])
    (charge,) = json.loads(shown.output)["charges"]
    assert charge["status"] == "pending" and charge["age"].endswith("m")
    assert f"ledger settle {run_id}" in runner.invoke(app, ["ledger", "show", "--db", str(db)]).output

    refused = runner.invoke(app, ["ledger", "settle", run_id, "--db", str(db)])
    assert refused.exit_code == 2 and "resumable checkpoint in" in refused.output and "step 3" not in refused.output
    assert "--abandon" in refused.output and Ledger(db).charge(run_id).status == "pending"

    abandoned = runner.invoke(app, ["ledger", "settle", run_id, "--db", str(db), "--abandon"])
    assert abandoned.exit_code == 0, abandoned.output
    assert "reserved ε" in abandoned.output and "3 steps" not in abandoned.output
    settled = Ledger(db).charge(run_id)
    assert settled.status == "failed" and settled.epsilon == settled.reserved_epsilon

    again = runner.invoke(app, ["ledger", "settle", run_id, "--db", str(db)])
    assert again.exit_code == 2 and "already failed" in again.output
    resumed = train(cfg, db, signing_key, "--resume")
    assert resumed.exit_code == 2 and "already failed" in resumed.output
    rerun = train(cfg, db, signing_key)
    assert rerun.exit_code == 2 and "holds a resume checkpoint" in rerun.output and "--overwrite" in rerun.output
    assert checkpoint.read_info(partial_dir(out)).step == 3  # untouched
    rerun = train(cfg, db, signing_key, "--overwrite")
    assert rerun.exit_code == 0, rerun.output
    assert sorted(c.status for c in Ledger(db).charges()) == ["failed", "settled"]


def test_overwrite_settles_a_discarded_unassigned_run(tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key):
    """A run without privacy.population killed after step 3, then rerun with --overwrite: the discarded run's
    pending unassigned charge is settled as failed at its reserved ε (never left pending, never at the step a
    signal reached)."""
    db, out = tmp_path / "u.sqlite3", tmp_path / "unassigned"
    raw = contract_dict(tiny_model_dir, tickets_csv, out, training={"steps": T, "checkpoint_every": 1})
    cfg = write_contract(tmp_path / "u.yaml", raw)
    hook_fault_point(monkeypatch, "after-step", 3, sigterm)
    assert train(cfg, db, signing_key).exit_code == 130
    monkeypatch.undo()
    info = checkpoint.read_info(partial_dir(out))
    (pending,) = Ledger(db).unassigned()
    assert pending.status == "pending" and pending.run_id == info.run_id
    rerun = train(cfg, db, signing_key, "--overwrite")
    assert rerun.exit_code == 0, rerun.output
    assert f"run {info.run_id} discarded: its ledger charge is settled at its reserved ε" in rerun.output
    assert f"step {info.step}" not in rerun.output
    charges = {c.run_id: c for c in Ledger(db).unassigned()}
    assert charges[info.run_id].status == "failed"
    assert charges[info.run_id].epsilon == pending.reserved_epsilon
    assert sorted(c.status for c in charges.values()) == ["failed", "settled"]


def test_resume_refuses_changed_contract_or_data_naming_them(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """--resume under another target ε or lr, or on edited data, is refused (exit 2) naming what changed;
    threads may change; with nothing to resume it says so."""
    data = tmp_path / "tickets.csv"
    data.write_bytes(tickets_csv.read_bytes())
    cfg, out, db = setup(tmp_path, tiny_model_dir, data, "changed", checkpoint_every=4)
    nothing = train(cfg, db, signing_key, "--resume")
    assert nothing.exit_code == 2 and "no resume checkpoint" in nothing.output
    hook_fault_point(monkeypatch, "after-step", 2, sigterm)
    assert train(cfg, db, signing_key).exit_code == 130
    monkeypatch.undo()
    for override, needle in (
        ("privacy.target_epsilon=4.0", "privacy.target_epsilon (8.0 → 4.0)"),
        ("training.lr=0.5", "training.lr (0.01 → 0.5)"),
    ):
        result = train(cfg, db, signing_key, "--resume", override)
        assert result.exit_code == 2 and needle in result.output, result.output
    lines = data.read_text().splitlines()
    data.write_text("\n".join([*lines[:-1], lines[-1].replace(",", ",x", 1)]) + "\n")
    result = train(cfg, db, signing_key, "--resume")
    assert result.exit_code == 2 and "the data changed since the checkpoint" in result.output
    assert "records then" not in result.output  # a count of the private data is never printed (issue 42.10)
    assert checkpoint.read_info(partial_dir(out)).step == 2  # refusals leave the checkpoint alone


def test_intermediate_release_only_after_the_dp_stop_rule(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """After SIGTERM, ledger record-release is refused (adapters at a step a signal chose are no DP output at any
    ε). After the DP stop rule (a non-finite parameter after step 3's noisy update, a DP output) it signs the
    latest checkpoint's adapters at its ε: verifiable, loadable with peft, a release of the same charge."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from dplora.errors import NoisyUpdateError

    cfg, out, db = setup(tmp_path, tiny_model_dir, tickets_csv, "inter", checkpoint_every=1)
    hook_fault_point(monkeypatch, "after-step", 3, sigterm)
    assert train(cfg, db, signing_key).exit_code == 130
    monkeypatch.undo()
    info = checkpoint.read_info(partial_dir(out))
    args = ["ledger", "record-release", info.run_id, "--db", str(db), "--signing-key", str(signing_key[0])]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "stopped by a signal or a failure" in refused.output, refused.output
    assert not list(tmp_path.glob("inter.step-*")) and Ledger(db).releases() == []

    def stop(*_):
        raise NoisyUpdateError("non-finite parameter after step 3")

    cfg, out, db = setup(tmp_path, tiny_model_dir, tickets_csv, "dpstop", checkpoint_every=1)
    hook_fault_point(monkeypatch, "after-step", 3, stop)
    assert train(cfg, db, signing_key).exit_code == 4
    monkeypatch.undo()
    failed = json.loads((partial_dir(out) / "FAILED.json").read_text())
    assert failed["stopped_on_dp_output"] is True and failed["steps_done"] == 3  # a DP output: its step is public
    info = checkpoint.read_info(partial_dir(out))
    assert info.step == 2  # the stop came before step 3's checkpoint
    args = ["ledger", "record-release", info.run_id, "--db", str(db), "--signing-key", str(signing_key[0])]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    folder = tmp_path / "dpstop.step-2"
    check = runner.invoke(app, ["verify", str(folder), "--public-key", str(signing_key[1])])
    assert check.exit_code == 0, check.output
    rec = _record(folder)
    assert rec["accounting"]["steps_done"] == 2 and rec["intermediate"]["steps_planned"] == T
    assert rec["accounting"]["epsilon_spent"] == info.meta["epsilon_upper"] < rec["accounting"]["target_epsilon"]
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), folder / "adapter")
    (release,) = Ledger(db).releases()
    assert release["label"] == "step-2" and len(Ledger(db).charges()) == 1
    assert runner.invoke(app, args).exit_code == 2  # the folder exists: never overwritten


def test_data_file_gone_before_the_release_stops_cleanly(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """The data file disappears mid-run (the keyed digest reads it at the end): exit 4 naming it; restored,
    --resume signs from the step-8 checkpoint without another step."""
    data = tmp_path / "tickets.csv"
    data.write_bytes(tickets_csv.read_bytes())
    data_key = tmp_path / "data.key"
    data_key.write_bytes(b"k" * 32)
    cfg, out, db = setup(tmp_path, tiny_model_dir, data, "gone")
    moved = tmp_path / "moved.csv"
    hook_fault_point(monkeypatch, "after-step", 5, lambda: data.rename(moved))
    result = train(cfg, db, signing_key, "--data-key", str(data_key))
    assert result.exit_code == 4, result.output
    (line,) = _error_lines(result.output)
    assert "No such file or directory" in line and str(data) in line and "a resume checkpoint is in" in line
    monkeypatch.undo()
    moved.rename(data)
    result = train(cfg, db, signing_key, "--data-key", str(data_key), "--resume")
    assert result.exit_code == 0, result.output
    assert _metric_steps(out)[-2:] == [8, "resumed@8"]


def test_resume_restores_the_lr_schedule(tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key):
    """A linear schedule with warmup, stopped after step 4 and resumed: every step runs at the rate of an
    uninterrupted run (step s at the schedule's s + 1 of T + 1), so the scheduler's state survives --resume."""
    from dplora.run import loop as run_mod

    real_step = run_mod.logical_step
    seen: dict[int, float] = {}

    def step(spec, state, units):
        seen[state.step] = state.optimizer.original_optimizer.param_groups[0]["lr"]
        if state.step == 4 and not resumed:
            raise MemoryError()
        return real_step(spec, state, units)

    resumed = False
    monkeypatch.setattr(run_mod, "logical_step", step)
    cfg, out, db = setup(tmp_path, tiny_model_dir, tickets_csv, "sched", lr_schedule="linear", warmup_steps=2)
    assert train(cfg, db, signing_key).exit_code == 4
    resumed = True
    result = train(cfg, db, signing_key, "--resume")
    assert result.exit_code == 0, result.output
    lr, warmup = 0.01, 2

    def expected(s: int) -> float:  # transformers' linear schedule at s + 1 over T + 1 steps
        k = s + 1
        return lr * (k / warmup if k < warmup else max(0.0, (T + 1 - k) / (T + 1 - warmup)))

    assert sorted(seen) == list(range(T))
    for s in range(T):
        assert seen[s] == pytest.approx(expected(s), rel=1e-9), s
    assert _record(out)["optimization"]["lr_schedule"] == "linear"


def test_a_data_file_moved_mid_run_does_not_stop_it(tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key):
    """Issue 42.10 (docs/resume.md): the data is read once before step 1, so moving the file after step 2 changes
    nothing: the run finishes all T steps and releases; a later --resume would refuse the missing file."""
    data = tmp_path / "moved.csv"
    shutil.copy(tickets_csv, data)
    cfg, out, db = setup(tmp_path, tiny_model_dir, data, "moved")
    hook_fault_point(monkeypatch, "after-step", 2, lambda: data.rename(tmp_path / "elsewhere.csv"))
    result = train(cfg, db, signing_key)
    assert result.exit_code == 0, result.output
    assert not data.exists() and _record(out)["accounting"]["steps_done"] == T


def _public(text: str, *roots: Path) -> str:
    """``text`` with what differs between two runs by construction masked: run ids (32 hex), the runs' own folders,
    and the time estimate (a probe's wall time, not the step reached)."""
    import re

    for i, root in enumerate(roots):
        text = text.replace(str(root), f"<root{i}>")
    text = re.sub(r"\b[0-9a-f]{32}\b", "<run_id>", text)
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("estimate:"))


def test_the_step_an_interruption_reached_never_reaches_the_public_surface(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """The same contract and data, SIGTERM after step 2 in one run and after step 6 in the other (a deadline that
    follows the private batches' times): the job output, --json's error, the public FAILED.json, `ledger show`, the
    resumed run's output and the abandoned charge are identical; only the private files differ."""
    seen = {}
    for k in (2, 6):
        root = tmp_path / f"k{k}"
        root.mkdir()
        cfg, out, db = setup(root, tiny_model_dir, tickets_csv, "run", checkpoint_every=None)
        hook_fault_point(monkeypatch, "after-step", k, sigterm)
        stopped = runner.invoke(
            app,
            ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress", "--ledger", str(db), "--json"],
            env={"CI": "true"},
        )
        monkeypatch.undo()
        assert stopped.exit_code == 130, stopped.output
        assert checkpoint.read_info(partial_dir(out)).step == k  # the private checkpoint holds the step reached
        assert json.loads((partial_dir(out) / "private" / "FAILED.json").read_text())["steps_done"] == k
        failed = (partial_dir(out) / "FAILED.json").read_text()
        shown = json.loads(runner.invoke(app, ["ledger", "show", "--db", str(db), "--json"]).output)
        (charge,) = shown["charges"]
        charge = {key: v for key, v in charge.items() if key not in ("age", "created_at", "settled_at", "reserved_at")}
        resumed = train(cfg, db, signing_key, "--resume")
        assert resumed.exit_code == 0, resumed.output
        rec = _record(out)
        seen[k] = {
            "stopped": _public(stopped.output, root),
            "failed": _public(failed, root),
            "ledger": _public(json.dumps(charge, sort_keys=True), root),
            "resumed": _public(resumed.output, root),
            "accounting": rec["accounting"],
        }
    assert seen[2] == seen[6]
    assert "interrupted (SIGTERM)" in seen[2]["stopped"] and "step 2" not in seen[2]["stopped"]
