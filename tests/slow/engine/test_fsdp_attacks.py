"""Attacks on ``training.sharding: fsdp``: does the DP guarantee hold on 2 FSDP ranks?

Every launch runs tests/fsdp_seams_worker.py (torchrun, 2 gloo ranks, or one plain process), whose TEST-ONLY
seams log what each rank forwarded and, where a test needs it, fix the sampled units and the noise vector (never
reachable from a contract or the CLI). Attacks, each pinned below:

1. noise: with the real OS-entropy generator and the real Poisson sampler, the released update's per-coordinate
   spread is σC (not √2σC from a draw per rank, not 2σC from one key on both), on every LoRA tensor; the ranks'
   tensors are bit-identical after every step; one accountant step and one draw per logical step;
2. unit placement: a user's records are forwarded on one rank only (the unit's, u mod W), a unit never on two;
   with fixed units and noise the clipped sum over both ranks is at most (units)·C in every step, and 0 in a step
   where no unit was sampled, though one rank padded;
3. padding: ranks with no unit, every rank empty, very different batch counts, physical batch 1, gradient
   checkpointing, and every padding loss made NaN: the 2-rank release equals one process's within 1e-5 (a padding
   row read into any sum would poison it); no private count reaches stdout (--json) or the log under CI;
4. resume: SIGTERM on rank 1 mid-run (attack 3's FSDP run), then --resume on 2 FSDP ranks: the checkpoint restores
   the tensors bit for bit and the release equals one process's; a rank that FAILS inside a step's forwards
   (FINDING, fixed: every rank deadlocked) ends the run with a resumable checkpoint and no release, which then
   finishes in ONE process under ``sharding: none``; a ``none`` checkpoint finishes on 2 FSDP ranks (FINDING,
   fixed: refused as a changed contract); ε and T exact throughout;
5. refusals: opacus, physical_batch_size auto, 4-bit, a .gguf model, ACCELERATE_USE_FSDP with sharding none,
   FSDP CPU offload: one line, exit 2, nothing written; a non-finite pad embedding under fsdp (FINDING, fixed: only
   the rank holding the pad row refused, rank 0 crashed with a traceback and left ``.partial`` behind);
6. data.public_warm_start with ``fsdp`` on 2 ranks, each with its own (different) public file: no deadlock, the
   ranks start from rank 0's warm start and agree (inside attack 1's launch).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import contract_dict, release_statement, write_contract

from dplora.data.demo import write_tickets

ROOT = Path(__file__).resolve().parents[3]
WORKER = ROOT / "tests" / "fsdp_seams_worker.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
C = 1e-3  # every unit of the tiny model is clipped (its gradient norms are far above)
# Global user units per step (37 users): rank 0 idle while rank 1 runs 6 users, every rank empty, rank 1 with one
# user against rank 0's seven, rank 1 idle against one user, then a mixed step. Physical batch 1: one forward per
# record, so the ranks' forward counts differ by up to a few dozen.
SCHEDULE = [[1, 3, 5, 7, 9, 11], [], [0, 2, 4, 6, 8, 10, 12, 1], [0], [1, 2, 35, 36]]
T = len(SCHEDULE)


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)
    return env


def _launch(tmp: Path, tag: str, args: list[str], seams: dict, *, ranks: int = 2, timeout: int = 240, env=None):
    """Run the worker (torchrun with 2 ranks, or one process); (completed process, its results folder)."""
    out = tmp / f"results-{tag}"
    out.mkdir()
    cmd = TORCHRUN if ranks == 2 else [sys.executable]
    dirs = [str(tmp / "rank0"), str(tmp / "rank1")]
    proc = subprocess.Popen(
        [*cmd, str(WORKER), str(out), *dirs, *args],
        env=_env(FSDP_SEAMS=json.dumps(seams), **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a hung launch is killed whole, workers included
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        workers = _children(proc.pid)  # torchrun starts each worker in a session of its own
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{tag}: the ranks did not finish within {timeout} s (a deadlock?): {stderr[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), out


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _exits(out: Path, ranks: int = 2) -> list:
    """Each rank's exit code, or "crashed" where the rank died before the worker could write it."""
    files = [out / f"rank{r}.json" for r in range(ranks)]
    return [json.loads(f.read_text())["exit_code"] if f.is_file() else "crashed" for f in files]


def _steps(out: Path, rank: int) -> list[dict]:
    return [json.loads(x) for x in (out / f"steps-rank{rank}.jsonl").read_text().splitlines()]


def _adapters(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "adapter" / "adapter_model.safetensors")


def _assert_same_adapters(got: Path, want: Path, rtol=1e-5, atol=1e-6) -> None:
    one, two = _adapters(want), _adapters(got)
    assert sorted(one) == sorted(two)
    for k in one:
        np.testing.assert_allclose(two[k].numpy(), one[k].numpy(), rtol=rtol, atol=atol, err_msg=k)


def _workdir(tmp: Path, tickets_csv: Path) -> None:
    for r in (0, 1):
        (tmp / f"rank{r}").mkdir()
        shutil.copy(tickets_csv, tmp / f"rank{r}" / "tickets.csv")


def _contract(tmp: Path, model_dir: Path, tickets_csv: Path, name: str, *, sharding="fsdp", **sections) -> str:
    """User-level units (37 users), C = 1e-3, SGD at lr 1 (the update is −(clipped sum + noise)/E), physical
    batch 1; ``sections`` update the defaults; the relative ``tickets.csv`` is each rank's own copy."""
    privacy = {"protected_unit": "user", "unit_key": "customer_id", "max_grad_norm": C, "noise_multiplier": 1.0}
    privacy.update(sections.pop("privacy", {}))
    training = {"steps": T, "physical_batch_size": 1, "sharding": sharding, "optimizer": "sgd", "lr": 1.0}
    training.update(sections.pop("training", {}))
    raw = contract_dict(model_dir, tickets_csv, tmp / name, privacy=privacy, training=training, **sections)
    raw["data"]["path"] = "tickets.csv"
    return write_contract(tmp / f"{name}.yaml", raw)


def _mechanism(release: Path) -> tuple[float, float, float]:
    """(σ, C, E) as the release record states them."""
    mechanism = release_statement(release)["predicate"]["mechanism"]
    expected = mechanism["normalizer"]["expected_units_per_step"]
    return float(mechanism["noise_multiplier"]), float(mechanism["max_grad_norm"]), float(expected)


def _train(contract: str, key: Path, *more: str) -> list[str]:
    return ["train", contract, "--signing-key", str(key), "--no-progress", *more]


# --- 1, 2, 6: real noise and real sampling on 2 FSDP ranks, after a public warm start ---------------------------------

SIGMA_WIDE = 8.0  # σ large against the ≤ ~8 clipped units per step: their sum moves the spread by ≤ ~3 %
WIDE_T = 2


@pytest.fixture(scope="module")
def wide(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    """2 FSDP ranks, OS-entropy noise, the real Poisson sampler, LoRA r 16 (P = 2048), σ = 8, two steps, each rank
    with its own public warm-start file (different rows), under CI with --json."""
    tmp = tmp_path_factory.mktemp("fsdp-wide")
    _workdir(tmp, tickets_csv)
    for r in (0, 1):
        write_tickets(tmp / f"rank{r}" / "public.csv", num_tickets=24, seed=450 + r)
    cfg = _contract(
        tmp,
        tiny_model_dir,
        tickets_csv,
        "wide",
        privacy={"noise_multiplier": SIGMA_WIDE},
        training={"steps": WIDE_T},
        lora={"r": 16, "alpha": 16},
        data={
            "public_warm_start": {"path": "public.csv", "steps": 3, "batch_size": 4, "lr": 0.05},
            "eval_fraction": 0.2,
        },
    )
    proc, out = _launch(tmp, "wide", _train(cfg, signing_key[0], "--json"), {"dump": True}, env={"CI": "true"})
    assert _exits(out) == [0, 0], proc.stderr[-3000:]
    return {"tmp": tmp, "out": out, "proc": proc, "release": tmp / "wide"}


def test_released_noise_has_spread_sigma_c_on_every_tensor_and_ranks_stay_bit_identical(wide):
    """Per-coordinate spread of −E·Δθ/lr over both steps = σC (ratio 1 ± 0.08; √2 or 2 fail), per tensor too."""
    sigma, clip, expected = _mechanism(wide["release"])
    assert (sigma, clip) == (SIGMA_WIDE, C)
    dumps = [np.load(wide["out"] / f"params-rank{r}.npz") for r in (0, 1)]
    for key in dumps[0].files:  # the same tensors on both ranks, bit for bit, before step 1 and after every step
        assert np.array_equal(dumps[0][key], dumps[1][key]), key
    states = [dumps[0]["pre"]] + [dumps[0][f"step{t}"] for t in range(1, WIDE_T + 1)]
    noise = np.stack([-(b - a).astype(np.float64) * expected for a, b in zip(states[:-1], states[1:], strict=True)])
    units = [len(s["units"]) for s in _steps(wide["out"], 0)]
    units = [a + len(b["units"]) for a, b in zip(units, _steps(wide["out"], 1), strict=True)]
    # −E·Δθ = clipped sum + noise, ‖clipped sum‖ ≤ units·C: a bias of at most this much on the norm
    bias = float(np.sqrt(sum((u * clip) ** 2 for u in units)))
    ratio = float(np.linalg.norm(noise)) / (sigma * clip * np.sqrt(noise.size))
    assert abs(ratio - 1) < 0.08, (ratio, bias / (sigma * clip * np.sqrt(noise.size)))
    sizes = [v.numel() for v in _adapters(wide["release"]).values()]
    assert sum(sizes) == noise.shape[1] == 2048
    start = 0
    for size in sizes:  # every tensor got its own noise: no coordinate drawn twice or left out
        block = noise[:, start : start + size]
        start += size
        assert abs(float(np.linalg.norm(block)) / (sigma * clip * np.sqrt(block.size)) - 1) < 0.25


def test_one_draw_and_one_accountant_step_per_logical_step_on_each_rank(wide):
    record = release_statement(wide["release"])["predicate"]
    info = record["execution"]["distributed"]
    assert record["execution"]["base_sharding"] == "fsdp" and info["noise_draws"] == WIDE_T
    assert [r["accountant_steps"] for r in info["ranks"]] == [WIDE_T, WIDE_T]
    assert info["ranks"][0]["adapter_sha256"] == info["ranks"][1]["adapter_sha256"]
    assert record["accounting"]["steps_done"] == record["accounting"]["steps_planned"] == WIDE_T
    digests = [[s["digest"] for s in _steps(wide["out"], r)] for r in (0, 1)]
    assert digests[0] == digests[1] and len(digests[0]) == WIDE_T
    lines = (Path(str(wide["release"]) + ".private") / "metrics.jsonl").read_text().splitlines()[1:]
    assert [json.loads(x).get("noise_draws") for x in lines if '"step"' in x] == [1] * WIDE_T


def test_a_users_records_and_the_user_stay_on_one_rank(wide, monkeypatch):
    """Real Poisson sampling: each sampled user on rank u mod 2 only, its records forwarded there and nowhere
    else, and each rank's forwards + padding = the most any rank ran."""
    rank_of_row, rows_of_unit = {}, {}
    logs = [_steps(wide["out"], r) for r in (0, 1)]
    for t in range(WIDE_T):
        seen = [set(), set()]
        for r in (0, 1):
            step = logs[r][t]
            assert all(u % 2 == r for u in step["units"]), step["units"]
            assert step["forwards"] == len(step["rows"])  # physical batch 1: one forward per record
            for row in step["rows"]:
                assert rank_of_row.setdefault(row, r) == r
            seen[r] = set(step["rows"])
        assert not seen[0] & seen[1]
        assert set(logs[0][t]["units"]).isdisjoint(logs[1][t]["units"])
        most = max(logs[0][t]["forwards"], logs[1][t]["forwards"])
        assert [logs[r][t]["forwards"] + logs[r][t]["padding"] for r in (0, 1)] == [most, most]
    from dplora.contract.loader import load_contract
    from dplora.data import units as data

    contract = load_contract(wide["tmp"] / "wide.yaml")
    monkeypatch.chdir(wide["tmp"] / "rank0")
    table, _ = data.load_split(contract.data, unit_key="customer_id", seed=contract.training.seed)
    index = data.build_unit_index(table, contract.privacy, seed=contract.training.seed)
    for r in (0, 1):
        for step in logs[r]:
            expected = [row for u in step["units"] for row in index.records_of_unit[u]]
            assert step["rows"] == expected  # every record of each of its users, and only those
            rows_of_unit.update({u: index.records_of_unit[u] for u in step["units"]})
    assert max(len(v) for v in rows_of_unit.values()) > 1  # user units with several records were sampled


def test_warm_start_under_fsdp_and_the_public_surface(wide):
    """Rank 0's warm start (the ranks had different public files) reached rank 1 before step 1; under CI with --json
    stdout is the public summary, the log has no count, the held-out evaluation is skipped in one line."""
    proc, record = wide["proc"], release_statement(wide["release"])["predicate"]
    public0 = (wide["tmp"] / "rank0" / "public.csv").read_bytes()
    import hashlib

    assert record["public_warm_start"]["sha256"] == hashlib.sha256(public0).hexdigest()
    summary = json.loads(proc.stdout)
    private = {"units", "records", "forwards", "padding", "empty_steps", "seconds", "records_zeroed", "loss"}
    assert not private & set(summary), summary
    allowed = (
        "public warm start:",
        "warning:",
        "device:",
        "distributed:",
        "estimate: not probed under training.sharding: fsdp",
        "held-out evaluation: skipped under training.sharding: fsdp",
        "done:",
        "private (not covered by DP",
        "private diagnostics (",
        "per-example check:",  # the synthetic-batch check before step 1: public model, LoRA init and tokens only
    )
    # a library's own notice (bitsandbytes' optional kernels hub check, offline) is a fact of the install, not data
    lines = [x for x in proc.stderr.splitlines() if x.strip() and "kernels-community/" not in x]
    assert all(x.startswith(allowed) for x in lines), [x for x in lines if not x.startswith(allowed)]
    assert sum(x.startswith("held-out evaluation: skipped") for x in lines) == 1
    assert "eval" not in json.dumps(record.get("evaluation") or {})


# --- 2, 3: fixed units and noise: FSDP against one process, padding everywhere --------------------------------------


def _checkpoint_step(staging: Path) -> int:
    from dplora.run import checkpoint

    return checkpoint.read_info(staging).step


def _resume(exact, name: str, *, sharding: str, ranks: int, tag: str, training=None, seams=None):
    """Resume ``name`` (under ``sharding``) with the seams moved to its checkpoint's step: (step resumed from, the
    launch, its results folder, the release record)."""
    tmp = exact["tmp"]
    at = _checkpoint_step(tmp / f"{name}.partial")
    assert 0 < at < T
    training = {"checkpoint_every": 1, **(training or {})}
    cfg = _contract(tmp, exact["model"], exact["csv"], name, sharding=sharding, training=training)
    seams = {"schedule": SCHEDULE[at:], "fixed_noise": at, **(seams or {})}
    proc, out = _launch(tmp, tag, _train(cfg, exact["key"], "--resume"), seams, ranks=ranks)
    assert _exits(out, ranks) == [0] * ranks, proc.stderr[-3000:]
    record = release_statement(tmp / name)["predicate"]
    assert record["accounting"]["steps_done"] == T
    reference = release_statement(tmp / "one")["predicate"]["accounting"]["epsilon_spent"]
    assert record["accounting"]["epsilon_spent"] == reference  # ε of T steps, as uninterrupted
    assert [len(x["units"]) for x in _steps(out, 0)] == [
        len([u for u in units if ranks == 1 or u % 2 == 0]) for units in SCHEDULE[at:]
    ]
    return at, proc, out, record


@pytest.fixture(scope="module")
def exact(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    """:data:`SCHEDULE` with fixed noise: one process (``none``), and 2 FSDP ranks with gradient checkpointing and
    every padding loss NaN, stopped by SIGTERM on rank 1 after step 2 and resumed on 2 FSDP ranks."""
    tmp = tmp_path_factory.mktemp("fsdp-exact")
    _workdir(tmp, tickets_csv)
    key = signing_key[0]
    seams = {"schedule": SCHEDULE, "fixed_noise": 0, "dump": True}
    one = _contract(tmp, tiny_model_dir, tickets_csv, "one", sharding="none")
    proc, out_one = _launch(tmp, "one", _train(one, key), seams, ranks=1)
    assert _exits(out_one, 1) == [0], proc.stderr[-3000:]
    ckpt = {"gradient_checkpointing": True, "checkpoint_every": 1}
    two = _contract(tmp, tiny_model_dir, tickets_csv, "two", training=ckpt)
    proc, out_two = _launch(tmp, "two", _train(two, key), {**seams, "nan_padding": True, "sigterm": [1, 2]})
    stopped = {"exits": _exits(out_two), "release": (tmp / "two").exists(), "stderr": proc.stderr}
    found = {"tmp": tmp, "one": out_one, "two": out_two, "model": tiny_model_dir, "csv": tickets_csv, "key": key}
    again = {"nan_padding": True, "dump": True}
    at, _, out_resumed, record = _resume(
        found, "two", sharding="fsdp", ranks=2, tag="two-resumed", training=ckpt, seams=again
    )
    return found | {"stopped": stopped, "at": at, "resumed": out_resumed, "record": record}


def _both_launches(exact) -> list[list[dict]]:
    """Each rank's step log over the stopped launch and the resumed one."""
    return [_steps(exact["two"], r) + _steps(exact["resumed"], r) for r in (0, 1)]


def test_padding_never_reaches_a_sum_two_fsdp_ranks_release_one_process(exact):
    tmp = exact["tmp"]
    _assert_same_adapters(tmp / "two", tmp / "one")
    logs = _both_launches(exact)
    assert [s["step"] for s in logs[0]] == list(range(1, T + 1))
    padding = [[s["padding"] for s in log] for log in logs]
    forwards = [[s["forwards"] for s in log] for log in logs]
    assert forwards[0][0] == 0 and padding[0][0] == forwards[1][0] > 10  # rank 0 had no unit: it only padded
    assert forwards[0][1] == forwards[1][1] == padding[0][1] == padding[1][1] == 0  # all empty: no forward at all
    assert padding[1][3] == forwards[0][3] > 0 and forwards[1][3] == 0
    for t in range(T):
        assert forwards[0][t] + padding[0][t] == forwards[1][t] + padding[1][t]


def test_the_clipped_sum_over_both_ranks_is_at_most_units_times_c(exact):
    """SGD at lr 1 with the seam's noise n_t (draw t−1): clipped sum c_t = −E·Δθ_t − n_t; ‖c_t‖ ≤ |units_t|·C, and 0
    where no unit was sampled (step 2; step 1's rank 0 padded only)."""
    import torch

    sigma, _, expected = _mechanism(exact["tmp"] / "two")
    first, second = ([np.load(d / f"params-rank{r}.npz") for r in (0, 1)] for d in (exact["two"], exact["resumed"]))
    for dumps in (first, second):
        for key in dumps[0].files:
            assert np.array_equal(dumps[0][key], dumps[1][key]), key
    at = exact["at"]
    assert np.array_equal(second[0]["pre"], first[0][f"step{at}"])  # the checkpoint restored the tensors exactly
    states = [first[0]["pre"]] + [(first if t <= at else second)[0][f"step{t}"] for t in range(1, T + 1)]
    for t, (a, b) in enumerate(zip(states[:-1], states[1:], strict=True)):
        g = torch.Generator().manual_seed(1000 + t)
        n = (torch.randn(a.size, generator=g, dtype=torch.float64) * sigma * C).float().double().numpy()
        clipped = -(b.astype(np.float64) - a) * expected - n
        bound = len(SCHEDULE[t]) * C
        assert np.linalg.norm(clipped) <= bound * (1 + 1e-3) + 1e-6, (t, np.linalg.norm(clipped), bound)
        if SCHEDULE[t]:
            assert np.linalg.norm(clipped) > 0.5 * C  # the units did contribute
        else:
            assert np.linalg.norm(clipped) <= 1e-6


# --- 4: resume and failure under fsdp -------------------------------------------------------------------------------


def test_sigterm_on_rank_1_stops_both_ranks_and_the_resumed_fsdp_run_is_exact(exact):
    """SIGTERM on rank 1 after step 2: both ranks stop after the same step (exit 130), no release, a checkpoint;
    --resume on 2 FSDP ranks releases T steps at the uninterrupted ε, one draw per step, identical ranks, and the
    one-process adapters (previous tests)."""
    stopped = exact["stopped"]
    assert stopped["exits"] == [130, 130] and not stopped["release"], stopped["stderr"][-3000:]
    assert exact["at"] in (2, 3)
    info = exact["record"]["execution"]["distributed"]
    assert info["noise_draws"] == T and [r["accountant_steps"] for r in info["ranks"]] == [T, T]
    assert info["ranks"][0]["adapter_sha256"] == info["ranks"][1]["adapter_sha256"]


def test_a_rank_failing_inside_the_forwards_leaves_a_resumable_checkpoint_and_no_release(exact):
    """FINDING: rank 1 raising in a forward of step 5 joined the step's reduction while rank 0 waited in FSDP's
    all-gather for the next forward: both ranks hung (gloo's 30 min timeout). Now the failing rank exits, rank 0's
    collective fails, rank 0 writes FAILED.json with the step-4 checkpoint; the run then finishes in one process
    under ``sharding: none`` (resume across sharding) with the one-process run's adapters."""
    tmp = exact["tmp"]
    cfg = _contract(tmp, exact["model"], exact["csv"], "fail", training={"checkpoint_every": 1})
    seams = {"schedule": SCHEDULE, "fixed_noise": 0, "fail": [1, 5, 1]}
    proc, out = _launch(tmp, "fail", _train(cfg, exact["key"]), seams, timeout=150)
    # each rank exits 4 with one line (the worker records it and returns): rank 1 its own error, rank 0 the
    # failure of its collective
    assert _exits(out) == [4, 4], proc.stderr[-3000:]
    assert "RuntimeError on rank 1; no release was written" in proc.stderr
    assert not (tmp / "fail").exists()  # no release
    failed = json.loads((tmp / "fail.partial" / "private" / "FAILED.json").read_text())
    assert failed["resume_checkpoint"]["step"] == failed["steps_done"] == 4
    at, proc, _, record = _resume(exact, "fail", sharding="none", ranks=1, tag="fail-resume")
    assert at == 4 and "this run uses 1" in proc.stderr
    assert record["execution"]["base_sharding"] == "none"
    _assert_same_adapters(tmp / "fail", tmp / "one")


def test_a_none_checkpoint_finishes_on_two_fsdp_ranks(exact):
    """FINDING: ``training.sharding`` was not among the keys a resume may change, so a run that ran out of memory
    under ``none`` could not continue under ``fsdp`` (refused as a changed contract). It changes neither the
    mechanism nor the accounting; the resumed 2-rank run releases the one-process adapters."""
    tmp = exact["tmp"]
    cfg = _contract(tmp, exact["model"], exact["csv"], "cross", sharding="none", training={"checkpoint_every": 1})
    seams = {"schedule": SCHEDULE, "fixed_noise": 0, "sigterm": [0, 2]}
    proc, out = _launch(tmp, "cross", _train(cfg, exact["key"]), seams, ranks=1)
    assert _exits(out, 1) == [130], proc.stderr[-3000:]
    at, proc, _, record = _resume(exact, "cross", sharding="fsdp", ranks=2, tag="cross-resume")
    assert at == 2 and "this run uses 2" in proc.stderr
    assert record["execution"]["base_sharding"] == "fsdp" and record["execution"]["distributed"]["noise_draws"] == T
    _assert_same_adapters(tmp / "cross", tmp / "one")


# --- 5: refusals ----------------------------------------------------------------------------------------------------

REFUSALS = {  # name → (privacy, training, model, environment) changes on an fsdp contract
    "opacus": ({"per_sample": "opacus"}, {}, {}, {}),
    "auto-physical": ({}, {"physical_batch_size": "auto"}, {}, {}),
    "4bit": ({}, {}, {"quantization": "4bit"}, {}),
    "gguf": ({}, {}, {"path": "GGUF"}, {}),
    "accelerate-fsdp-on-none": ({}, {"sharding": "none"}, {}, {"ACCELERATE_USE_FSDP": "true"}),
    "accelerate-offload": ({}, {}, {}, {"ACCELERATE_USE_FSDP": "true", "FSDP_OFFLOAD_PARAMS": "true"}),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refused_in_one_line_exit_2_nothing_written(
    name, tmp_path, tiny_model_dir, tickets_csv, signing_key, monkeypatch
):
    from typer.testing import CliRunner

    from dplora.cli.app import app
    from dplora.ledger.store import default_ledger_path

    privacy, training, model, env = REFUSALS[name]
    if model.get("path") == "GGUF":
        model = {"path": str(tmp_path / "base.gguf")}
        (tmp_path / "base.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))
    raw = contract_dict(
        tiny_model_dir,
        tickets_csv,
        tmp_path / "out",
        privacy={"max_grad_norm": C, **privacy},
        training={"steps": 2, "physical_batch_size": 2, "sharding": "fsdp", **training},
    )
    raw["model"].update(model)
    cfg = write_contract(tmp_path / "c.yaml", raw)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CI", "true")
    ledger = default_ledger_path()
    before = ledger.stat().st_mtime_ns if ledger.exists() else None
    result = CliRunner().invoke(app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"])
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == (["base.gguf", "c.yaml"] if name == "gguf" else ["c.yaml"])
    assert (ledger.stat().st_mtime_ns if ledger.exists() else None) == before


def test_a_non_finite_pad_embedding_is_refused_alike_on_every_fsdp_rank(tmp_path, tickets_csv, signing_key):
    """FINDING: under fsdp only the rank holding the pad row (rank 1: rows 129-257) checked it: rank 1 exited 2,
    rank 0 crashed in the next collective (exit 1, a gloo traceback) and left ``out.partial``. Now one all-reduce
    tells every rank: both exit 2, the first process prints the one line, nothing written."""
    import torch
    from tiny import byte_tokenizer, tiny_llama

    model = tiny_llama()
    with torch.no_grad():
        model.model.embed_tokens.weight[256] = float("nan")  # the pad token (id 256)
    model.save_pretrained(tmp_path / "model")
    byte_tokenizer().save_pretrained(tmp_path / "model")
    _workdir(tmp_path, tickets_csv)
    cfg = _contract(tmp_path, tmp_path / "model", tickets_csv, "out")
    proc, out = _launch(tmp_path, "nan", _train(cfg, signing_key[0]), {}, timeout=120)
    assert _exits(out) == [2, 2], proc.stderr[-3000:]
    # the first process speaks for the node (docs/multi-gpu.md, bad input under a launcher); the other is silent
    assert proc.stderr.count("embedding of the padding token (id 256) is not finite") == 1
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
