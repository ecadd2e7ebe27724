"""``training.sharding: fsdp`` (issue 45): the base sharded over 2 gloo processes, the mechanism unchanged.

The reference is one process with ``sharding: none``. Both run tests/fsdp_worker.py, whose test-only seams fix the
sampled units (each rank takes its shard, u mod W) and the noise vector (the same draw d in one process as on rank 0),
so the released adapters must be equal within 1e-5 (fp32), with every unit clipped (C far below every unit's
gradient norm), for row- and user-level units, with and without gradient checkpointing. The schedule gives the ranks
different numbers of units and physical batches, an empty step, and a step where one rank has no unit: FSDP's
collectives then need the padding forwards, whose rows must not enter any sum.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from conftest import contract_dict, release_statement, write_contract

ROOT = Path(__file__).resolve().parents[3]
WORKER = ROOT / "tests" / "fsdp_worker.py"
CONFIGS = {  # name → (privacy, training) changes
    "rows": ({}, {}),
    "rows-ckpt": ({}, {"gradient_checkpointing": True}),
    "units": ({"protected_unit": "user", "unit_key": "customer_id"}, {}),
    "units-ckpt": ({"protected_unit": "user", "unit_key": "customer_id"}, {"gradient_checkpointing": True}),
}
STEPS = 5  # = len(fsdp_worker.SCHEDULE)


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONFAULTHANDLER="1")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _contracts(
    tmp: Path, model_dir: Path, tickets_csv: Path, sharding: str, tag: str, names=tuple(CONFIGS)
) -> list[str]:
    """One contract per config, C = 1e-3 (every unit clipped); N declared from ``tickets_csv``, then the data path
    made relative (``tickets.csv`` in each rank's folder)."""
    runs = []
    for name in names:
        privacy, training = CONFIGS[name]
        raw = contract_dict(
            model_dir,
            tickets_csv,
            tmp / f"{tag}-{name}",
            privacy={"max_grad_norm": 1e-3, **privacy},
            training={"steps": STEPS, "physical_batch_size": 2, "sharding": sharding, **training},
        )
        raw["data"]["path"] = "tickets.csv"
        runs.append(f"{name}={write_contract(tmp / f'{tag}-{name}.yaml', raw)}")
    return runs


def _rank_dirs(tmp: Path, tickets_csv: Path) -> list[str]:
    dirs = []
    for r in (0, 1):
        d = tmp / f"rank{r}"
        d.mkdir(exist_ok=True)
        shutil.copy(tickets_csv, d / "tickets.csv")
        dirs.append(str(d))
    return dirs


def _launch(cmd: list[str], tmp: Path, key: Path, dirs: list[str], runs: list[str], tag: str, timeout=900):
    out = tmp / f"results-{tag}"
    out.mkdir(exist_ok=True)
    proc = subprocess.run(
        [*cmd, str(WORKER), str(out), str(key), *dirs, *runs],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc


def _adapters(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "adapter" / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    """Every config trained in one process (sharding none) and on 2 gloo ranks (sharding fsdp)."""
    tmp = tmp_path_factory.mktemp("fsdp")
    dirs = _rank_dirs(tmp, tickets_csv)
    key = signing_key[0]
    one = _contracts(tmp, tiny_model_dir, tickets_csv, "none", "single")
    single, _ = _launch([sys.executable], tmp, key, dirs, one, "single")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    stderr = ""
    for run in _contracts(tmp, tiny_model_dir, tickets_csv, "fsdp", "fsdp"):  # one launch per run (one group each)
        sharded, proc = _launch(cmd, tmp, key, dirs, [run], "fsdp")
        stderr += proc.stderr
    return {"tmp": tmp, "dirs": dirs, "single": single, "sharded": sharded, "stderr": stderr}


def _exit(out: Path, name: str, rank: int) -> int:
    return json.loads((out / f"{name}-rank{rank}.json").read_text())["exit_code"]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_two_fsdp_ranks_release_the_single_process_adapters(runs, name):
    """Fixed units and noise: the 2-rank FSDP adapters equal one process's within 1e-5, and they moved."""
    tmp = runs["tmp"]
    assert _exit(runs["single"], name, 0) == 0
    assert (_exit(runs["sharded"], name, 0), _exit(runs["sharded"], name, 1)) == (0, 0), runs["stderr"][-3000:]
    one, two = _adapters(tmp / f"single-{name}"), _adapters(tmp / f"fsdp-{name}")
    assert sorted(one) == sorted(two)
    init = {k: v for k, v in one.items() if "lora_B" in k}
    assert max(float(v.abs().max()) for v in init.values()) > 1e-4  # B started at zero: the run moved it
    for k in one:
        np.testing.assert_allclose(two[k].numpy(), one[k].numpy(), rtol=1e-5, atol=1e-6, err_msg=k)


def test_the_fsdp_record_names_the_sharding_and_each_rank_holds_half_the_base(runs, tiny_model_dir):
    """The record: world size 2, base sharding fsdp, one noise draw per step over both ranks, T accountant steps and
    the same adapters on each rank, and each rank's share of the base counted from its local shards (≈ 1/2)."""
    from safetensors import safe_open

    with safe_open(str(tiny_model_dir / "model.safetensors"), framework="pt") as fh:
        total = sum(int(np.prod(fh.get_slice(k).get_shape())) for k in fh.keys())
    for name in CONFIGS:
        execution = release_statement(runs["tmp"] / f"fsdp-{name}")["predicate"]["execution"]
        assert execution["world_size"] == 2 and execution["base_sharding"] == "fsdp"
        info = execution["distributed"]
        assert info["noise_draws"] == STEPS
        ranks = info["ranks"]
        assert [r["accountant_steps"] for r in ranks] == [STEPS, STEPS]
        assert ranks[0]["adapter_sha256"] == ranks[1]["adapter_sha256"]
        held = [r["base_parameters_held"] for r in ranks]
        assert sum(held) == total and all(abs(h - total / 2) <= 0.02 * total for h in held), (held, total)
        single = release_statement(runs["tmp"] / f"single-{name}")["predicate"]["execution"]
        assert single["base_sharding"] == "none" and single["world_size"] == 1


def test_verify_shows_the_world_size_and_sharding(runs, signing_key):
    from typer.testing import CliRunner

    from dplora.cli.app import app

    result = CliRunner().invoke(app, ["verify", str(runs["tmp"] / "fsdp-rows"), "--public-key", str(signing_key[1])])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("execution:"))
    assert line.startswith("execution: 2 process(es) (") and "base sharding fsdp" in line
    assert "base parameters held per rank: " in line
    single = CliRunner().invoke(app, ["verify", str(runs["tmp"] / "single-rows"), "--public-key", str(signing_key[1])])
    assert "execution: 1 process(es) (single process), base sharding none" in single.output


def test_fsdp_ranks_with_different_data_stop_before_step_1(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """Rank 1 reads other rows: every rank exits 2 before the model loads; nothing is released."""
    import csv

    dirs = _rank_dirs(tmp_path, tickets_csv)
    with tickets_csv.open(newline="") as fh:
        rows = list(csv.reader(fh))
    with (Path(dirs[1]) / "tickets.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows([rows[0], *reversed(rows[1:])])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    runs = _contracts(tmp_path, tiny_model_dir, tickets_csv, "fsdp", "x", ["rows"])
    out, proc = _launch(cmd, tmp_path, signing_key[0], dirs, runs, "x")
    assert (_exit(out, "rows", 0), _exit(out, "rows", 1)) == (2, 2)
    assert "the ranks disagree before step 1" in proc.stderr or "the ranks disagree before step 1" in proc.stdout
    assert not (tmp_path / "x-rows").exists()


@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_two_torchrun_nodes_on_this_machine(tmp_path, tiny_model_dir, tickets_csv, signing_key, sharding):
    """``torchrun --nnodes 2`` (one process per "node", rendezvous on 127.0.0.1): one verified release, equal to
    the one-process run with the same units and noise."""
    dirs = _rank_dirs(tmp_path, tickets_csv)
    key = signing_key[0]
    one = _contracts(tmp_path, tiny_model_dir, tickets_csv, "none", "one", ["rows"])
    _launch([sys.executable], tmp_path, key, dirs, one, "one")
    runs = _contracts(tmp_path, tiny_model_dir, tickets_csv, sharding, "nodes", ["rows"])
    port = _free_port()
    out = tmp_path / "results-nodes"
    out.mkdir()
    procs = []
    for node in (0, 1):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
            "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                [*cmd, str(WORKER), str(out), str(key), *dirs, *runs],
                env=_env() | {"DPLORA_TEST_NODE": str(node)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
    assert (_exit(out, "rows", 0), _exit(out, "rows", 1)) == (0, 0)
    execution = release_statement(tmp_path / "nodes-rows")["predicate"]["execution"]
    assert execution["world_size"] == 2 and execution["base_sharding"] == sharding
    one, two = _adapters(tmp_path / "one-rows"), _adapters(tmp_path / "nodes-rows")
    for k in one:
        np.testing.assert_allclose(two[k].numpy(), one[k].numpy(), rtol=1e-5, atol=1e-6, err_msg=k)


def test_a_rank_failing_between_forwards_stops_both_ranks_and_rank_0_records_it(
    tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    """Rank 1's clipping raises in step 4, after its first of 3 forwards (rank 0 runs 1 forward and 2 padding
    forwards there): rank 1 runs its remaining forwards as padding and reports through the step's reduction, so both
    ranks stop within seconds, long before the collective timeout (set to 900 s, above this test's limit), with
    exit 4; rank 0 writes FAILED.json naming rank 1, no release, and the ledger charge is left as the resume rules
    say (a resume checkpoint exists: pending at its reservation, for ``--resume`` or ``dplora ledger settle``)."""
    from dplora.ledger.store import Ledger

    dirs = _rank_dirs(tmp_path, tickets_csv)
    runs = _contracts(tmp_path, tiny_model_dir, tickets_csv, "fsdp", "fail", ["rows"])
    out = tmp_path / "results"
    out.mkdir()
    ledger = tmp_path / "ledger.sqlite3"
    env = _env() | {"FSDP_WORKER_FAIL": "1:4", "DPLORA_COLLECTIVE_TIMEOUT_S": "900", "DPLORA_LEDGER": str(ledger)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*cmd, str(WORKER), str(out), str(signing_key[0]), *dirs, *runs],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert all((out / f"rows-rank{r}.json").is_file() for r in (0, 1)), proc.stderr[-6000:]
    ranks = [json.loads((out / f"rows-rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["exit_code"] for r in ranks] == [4, 4], proc.stderr[-3000:]
    assert max(r["exited_at"] for r in ranks) - ranks[1]["failed_at"] < 60  # prompt: no rank waited for a timeout
    assert "rank 1 failed: RuntimeError" in proc.stderr
    assert not (tmp_path / "fail-rows").exists()  # no release
    failed = json.loads((tmp_path / "fail-rows.partial" / "FAILED.json").read_text())
    assert failed["reason"] == "rank 1 failed: RuntimeError" and "steps_done" not in failed
    assert failed["resume"] is not None and failed["release"] == "none (run failed)"
    private = json.loads((tmp_path / "fail-rows.partial" / "private" / "FAILED.json").read_text())
    assert private["steps_done"] == 3 and private["resume_checkpoint"] is not None
    charge = Ledger(ledger).charge(failed["run_id"])
    assert charge.status == "pending" and charge.reserved_epsilon >= Decimal(str(private["epsilon_spent_upper_bound"]))
