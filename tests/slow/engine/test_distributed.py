"""Multi-process DP-LoRA over gloo: two CPU processes, started by torchrun and by ``accelerate launch``.

Two launches, each checked against an independent reference:
- ``torchrun --nproc-per-node 2 tests/dist_worker.py``: the sharded sampler for 400 steps (units per step against
  q·N, the two ranks' inclusion indicators against independence, and the same check failing when both ranks share
  a seed), the reduction on zero sums (noise variance against one draw of (σC)², not two), and one σ = 0 step on a
  tiny LoRA Llama against the single-process step and a brute-force per-record reference (fast and Opacus paths);
- ``accelerate launch --num_processes 2 -m dplora train``: the whole run (one release that ``verify`` accepts, one
  ledger charge, one noise draw per step, T accountant steps on each rank, identical adapters on both ranks).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import dist_worker as W
import numpy as np
import pytest
from conftest import contract_dict, release_statement, write_contract

from dplora.engine import distributed

ROOT = Path(__file__).resolve().parents[3]


def _env(**extra) -> dict:
    """The test's environment (ledger, cache) with this checkout first on the path and no GPU."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RESUME_T, RESUME_AT = 6, 3


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    """A one-process run stopped by SIGTERM after step 3 of 6 (exit 130, resume checkpoint of step 3)."""
    from typer.testing import CliRunner

    from dplora.cli.app import app
    from dplora.ledger.store import Ledger
    from dplora.run import checkpoint

    tmp = tmp_path_factory.mktemp("resume")
    db = tmp / "ledger.sqlite3"
    Ledger(db).set_cap("tickets", epsilon_max="100", delta_max="1e-3", protected_unit="row", adjacency="add_remove")
    out = tmp / "run"
    training = {"steps": RESUME_T, "checkpoint_every": 4}
    cfg = write_contract(
        tmp / "contract.yaml",
        contract_dict(tiny_model_dir, tickets_csv, out, privacy={"population": "tickets"}, training=training),
    )

    def sigterm_after_step_3(point, step):
        if (point, step) == ("after-step", RESUME_AT):
            os.kill(os.getpid(), signal.SIGTERM)

    args = ["train", str(cfg), "--signing-key", str(signing_key[0]), "--ledger", str(db)]
    with checkpoint.fault_hook(sigterm_after_step_3):
        result = CliRunner().invoke(app, [*args, "--no-progress"])
    assert result.exit_code == 130, result.output
    assert checkpoint.read_info(out.with_name("run.partial")).step == RESUME_AT
    return {"args": args[1:], "out": out, "ledger": db}


@pytest.fixture(scope="module")
def worker(tmp_path_factory, interrupted):
    """Run tests/dist_worker.py on 2 processes (torchrun, gloo); rank 0's results. Its last part resumes the
    ``interrupted`` run on both ranks."""
    out = tmp_path_factory.mktemp("dist-worker")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*cmd, str(ROOT / "tests" / "dist_worker.py"), str(out), *interrupted["args"]],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    arrays = np.load(out / "results.npz")
    summary = json.loads((out / "results.json").read_text())
    summary["resume_exit"] = json.loads((out / "resume_exit.json").read_text())["rank0"]
    summary["stderr"] = proc.stderr
    return summary, {k: arrays[k] for k in arrays.files}


def _shards(summary) -> tuple[np.ndarray, np.ndarray]:
    return np.array(summary["shards"][0]), np.array(summary["shards"][1])


def _pairwise_correlation(ind: np.ndarray, shards) -> tuple[float, int]:
    """Pearson r between rank 0's and rank 1's indicator at the same shard position j, over steps and j."""
    m = min(len(s) for s in shards)
    x = ind[:, 0, shards[0][:m]].astype(float).ravel()
    y = ind[:, 1, shards[1][:m]].astype(float).ravel()
    return float(np.corrcoef(x, y)[0, 1]), len(x)


def test_union_of_the_shards_is_one_poisson_sample_at_rate_q(worker):
    summary, arrays = worker
    ind = arrays["real"]  # (steps, ranks, N)
    steps, ranks, n = ind.shape
    assert (summary["world_size"], summary["launcher"], summary["backend"]) == (2, "torchrun", "gloo")
    assert (steps, ranks, n) == (W.SAMPLER_STEPS, 2, W.N_UNITS)
    s0, s1 = _shards(summary)
    assert sorted([*s0, *s1]) == list(range(n)) and not set(s0) & set(s1)  # disjoint, cover every unit
    for rank, shard in enumerate((s0, s1)):  # a rank samples only its own shard
        outside = np.setdiff1d(np.arange(n), shard)
        assert ind[:, rank, outside].sum() == 0
    per_step = ind.sum(axis=(1, 2))
    q = W.RATE
    se = math.sqrt(n * q * (1 - q) / steps)  # Binomial(N, q) per step, mean over steps
    assert abs(per_step.mean() - q * n) < 4 * se, (per_step.mean(), q * n, se)
    assert abs(per_step.mean() - 2 * q * n) > 4 * se  # not twice the rate (each rank sampling all units)
    rate = ind.sum(axis=1).mean(axis=0)  # per-unit inclusion frequency
    assert abs(rate.mean() - q) < 4 * math.sqrt(q * (1 - q) / (steps * n))


def test_ranks_inclusions_are_uncorrelated_and_a_shared_seed_is_caught(worker):
    summary, arrays = worker
    shards = _shards(summary)
    r, n = _pairwise_correlation(arrays["real"], shards)
    bound = 4 / math.sqrt(n)  # |r| under independence: about N(0, 1/n)
    assert abs(r) < bound, (r, bound)
    counts = arrays["real"].sum(axis=2)  # (steps, ranks)
    r_counts = float(np.corrcoef(counts[:, 0], counts[:, 1])[0, 1])
    assert abs(r_counts) < 4 / math.sqrt(len(counts))
    # The same statistics on ranks whose generators share a seed: both checks fail, as they must.
    r_shared, _ = _pairwise_correlation(arrays["shared"], shards)
    shared_counts = arrays["shared"].sum(axis=2)
    assert r_shared > bound and r_shared > 0.99
    assert float(np.corrcoef(shared_counts[:, 0], shared_counts[:, 1])[0, 1]) > 4 / math.sqrt(len(counts))


def test_noise_is_drawn_once_per_logical_step_across_ranks(worker):
    summary, arrays = worker
    assert summary["step_draws"] == [1.0] * W.NOISE_STEPS and summary["run_draws"] == W.NOISE_STEPS
    assert summary["noise_same_on_ranks"]
    z = arrays["noise"].astype(np.float64).ravel() / (W.SIGMA * W.CLIP)  # zero sums, E = 1: the noise alone
    n = z.size
    assert abs(z.mean()) < 5 / math.sqrt(n)
    variance = float(z.var())
    assert abs(variance - 1) < 5 * math.sqrt(2 / n), variance  # one draw of (σC)²; two draws would give 2
    assert summary["two_draws"] == "the noise was drawn 2 times in one logical step, not once"


def test_a_failure_on_one_rank_stops_every_rank(worker):
    """Rank 1 fails: in a step every rank raises (rank 0 naming rank 1), in a setup gate with the same exit code."""
    summary, _ = worker
    rank0, rank1 = summary["failures"]
    message = "non-finite loss at logical step 3: stopping without a release"
    assert rank1["step"] == ["TrainingFailedError", message]
    assert rank0["step"] == ["TrainingFailedError", f"rank 1 failed: {message}"]
    assert rank1["gate"] == ["BadInputError", "data file x.csv has no rows"]
    assert rank0["gate"] == ["BadInputError", "rank 1: data file x.csv has no rows"]


@pytest.mark.parametrize("path", ["fast", "opacus"])
def test_all_reduced_clipped_sum_equals_single_process_and_brute_force(worker, path):
    """σ = 0: the 2-rank step's clipped sum is the one-process sum over the same units, and the hand reference."""
    summary, arrays = worker
    assert summary["rank_units"] == [0, 2, 4, 6]  # rank 1 holds unit 3: both ranks contribute
    brute = arrays["brute"]
    assert arrays["unit_norms"].min() > W.STEP_CLIP  # every unit is clipped: the reference is not trivial
    dist_sum, single = arrays[f"{path}_dist"], arrays[f"{path}_single"]
    assert summary[f"{path}_ranks_equal"] and summary[f"{path}_dist_steps"] == 1
    assert float(np.abs(brute).max()) > 1e-3
    np.testing.assert_allclose(dist_sum, single, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dist_sum, brute, rtol=1e-4, atol=1e-6)
    assert np.linalg.norm(dist_sum) <= len(W.SAMPLED) * W.STEP_CLIP * (1 + 1e-5)


def test_two_processes_resume_a_one_process_checkpoint(worker, interrupted, signing_key):
    """The run stopped after step 3 (one process) finishes on two: rank 0 restores the checkpoint and sends its
    tensors, AdamW state and counts to rank 1, says that the world size changed, and releases T steps."""
    from safetensors.torch import load_file

    from dplora.ledger.store import Ledger
    from dplora.release.verify import verify_release

    summary, _ = worker
    out = interrupted["out"]
    assert summary["resume_exit"] == 0, summary["stderr"][-3000:]
    stderr = summary["stderr"]
    assert "from its checkpoint;" in stderr and f"step {RESUME_AT}/{RESUME_T}" not in stderr
    assert "note: the checkpoint was written by a run on 1 process(es); this run uses 2." in stderr
    verify_release(out, signing_key[1])
    record = _record(out / "release.dsse.json")
    assert record["accounting"]["steps_done"] == RESUME_T
    info = record["execution"]["distributed"]
    assert record["execution"]["world_size"] == 2 and info["noise_draws"] == RESUME_T
    released = distributed.state_dict_digest(load_file(out / "adapter" / "adapter_model.safetensors"))
    # Same adapters on both ranks: rank 1 had AdamW's moments from rank 0 (fresh moments would differ).
    assert [(r["accountant_steps"], r["adapter_sha256"]) for r in info["ranks"]] == [(RESUME_T, released)] * 2
    lines = [
        json.loads(x) for x in (out.with_name(out.name + ".private") / "metrics.jsonl").read_text().splitlines()[1:]
    ]
    steps = [x.get("step", f"resumed@{x.get('resumed_at_step')}") for x in lines]
    assert steps == [1, 2, 3, "resumed@3", 4, 5, 6]
    assert [x["noise_draws"] for x in lines[4:]] == [1, 1, 1]  # the two-process steps
    (charge,) = Ledger(interrupted["ledger"]).charges()
    assert charge.status == "settled"


def _record(release_path: Path) -> dict:
    return release_statement(release_path)["predicate"]


def test_accelerate_launch_two_processes_one_verified_release(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    from safetensors.torch import load_file

    from dplora.ledger.store import Ledger
    from dplora.release.verify import verify_release

    steps = 4
    out = tmp_path / "run"
    raw = contract_dict(tiny_model_dir, tickets_csv, out, privacy={"population": "tickets"}, training={"steps": steps})
    cfg = write_contract(tmp_path / "contract.yaml", raw)
    ledger = Ledger(Path(os.environ["DPLORA_LEDGER"]))
    ledger.set_cap("tickets", epsilon_max=1000, delta_max=0.5, protected_unit="row", adjacency="add_remove")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    launch += ["--main_process_port", str(_free_port())]
    proc = subprocess.run(
        [*launch, "-m", "dplora", "train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("release: ") == 1  # rank 0 reports for the run
    assert "distributed: 2 processes (accelerate launch (torchrun), gloo)" in proc.stderr
    verify_release(out, signing_key[1])  # raises on any mismatch
    record = _record(out / "release.dsse.json")
    execution = record["execution"]
    assert (execution["world_size"], execution["launcher"]) == (2, "accelerate launch (torchrun)")
    info = execution["distributed"]
    assert info["backend"] == "gloo" and info["noise_draws"] == steps  # one draw per step over both ranks
    assert record["accounting"]["steps_done"] == record["accounting"]["steps_planned"] == steps
    weights = load_file(out / "adapter" / "adapter_model.safetensors")
    released = distributed.state_dict_digest(weights)
    assert [r["rank"] for r in info["ranks"]] == [0, 1]
    for rank in info["ranks"]:  # every rank's accountant stepped T times and holds the released adapters
        assert rank["accountant_steps"] == steps and rank["adapter_sha256"] == released
    lines = [
        json.loads(x) for x in (out.with_name(out.name + ".private") / "metrics.jsonl").read_text().splitlines()[1:]
    ]
    assert [x["step"] for x in lines] == list(range(1, steps + 1))
    assert all(x["noise_draws"] == 1 for x in lines)
    charges = ledger.charges("tickets")
    assert len(charges) == 1 and charges[0].status == "settled"  # one ledger charge, by rank 0
    assert len(ledger.releases(population="tickets")) == 1
    assert not (tmp_path / "run.lock").exists() and not (tmp_path / "run.partial").exists()


def test_budget_prints_expected_units_per_rank_per_step(tmp_path, tiny_model_dir, tickets_csv):
    """N = 120 rows, B = 8: q = 1/15; W = 7 shards of 17 or 18 units hold q·17 to q·18 expected units per step."""
    from typer.testing import CliRunner

    from dplora.cli.app import app

    cfg = write_contract(tmp_path / "contract.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp_path / "run"))
    runner = CliRunner()
    result = runner.invoke(app, ["budget", str(cfg), "--json", "--world-size", "7"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["num_units"] == 120 and report["expected_batch_size"] == 8
    ranks = report["units_per_rank"]
    assert ranks["world_size"] == 7
    assert ranks["expected_min"] == pytest.approx(17 / 15) and ranks["expected_max"] == pytest.approx(18 / 15)
    assert (report["sample_rate"], report["steps"]) == (pytest.approx(1 / 15), 3)  # the plan does not move with W
    table = runner.invoke(app, ["budget", str(cfg)])  # one process by default: all B units on the one rank
    assert table.exit_code == 0 and re.search(r"units per rank per step\s+│ 8 expected, W=1 processes", table.stdout)
    bad = runner.invoke(app, ["budget", str(cfg), "--world-size", "0"])
    assert bad.exit_code == 2 and bad.output.startswith("error: ") and len(bad.output.strip().splitlines()) == 1


class _FakeState:
    """accelerate's PartialState without a process group: records the keyword arguments it was given."""

    calls: list = []

    def __init__(self, cpu=False, **kwargs):
        _FakeState.calls.append({"cpu": cpu, **kwargs})
        self.process_index, self.num_processes, self.local_process_index = 1, 2, 1
        self.backend = "gloo" if cpu else "nccl"


def test_the_process_group_gets_a_bounded_collective_timeout_and_nccl_async_error_handling(monkeypatch):
    """A peer that died inside a collective ends the others' wait within the timeout (5 min, not torch's 10 or 30);
    on CUDA, ProcessGroupNCCL is created with TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless the operator chose a value."""
    import datetime

    import accelerate
    import torch

    from dplora.errors import BadInputError

    monkeypatch.setattr(accelerate, "PartialState", _FakeState)
    monkeypatch.setattr(_FakeState, "calls", [])
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")  # recorded, so the value init_world sets is undone
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    world = distributed.init_world(env)
    assert world.rank == 1 and world.world_size == 2 and world.backend == "gloo"
    assert _FakeState.calls[-1] == {"cpu": True, "timeout": datetime.timedelta(seconds=300)}
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ  # gloo: nothing set
    distributed.init_world(env | {"DPLORA_COLLECTIVE_TIMEOUT_S": "42.5"})
    assert _FakeState.calls[-1]["timeout"] == datetime.timedelta(seconds=42.5)
    for bad in ("0", "-1", "soon", "inf"):
        with pytest.raises(BadInputError, match="DPLORA_COLLECTIVE_TIMEOUT_S"):
            distributed.init_world(env | {"DPLORA_COLLECTIVE_TIMEOUT_S": bad})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert distributed.init_world(env).backend == "nccl"
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")  # the operator's own choice is kept
    distributed.init_world(env)
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert distributed.init_world({"WORLD_SIZE": "1"}) is distributed.SINGLE  # one process: no group, no timeout
    assert len(_FakeState.calls) == 4
