"""Helpers shared by the tests that start ``torchrun`` (2 gloo processes on CPU):
tests/slow/cli/test_launcher_errors.py, tests/slow/engine/test_distributed_inputs.py and
tests/slow/engine/test_warm_start_distributed.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import write_contract

ROOT = Path(__file__).resolve().parents[2]


TORCHRUN_2 = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def cpu_env() -> dict:
    """This environment with the repository on PYTHONPATH, no GPU, one OpenMP thread, no warnings."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return env


def train_on_two_ranks(tmp_path: Path, raw: dict, dirs: list[Path], signing_key) -> tuple:
    """``dplora train`` of ``raw`` (written to tmp_path/contract.yaml) on 2 ranks of tests/dist_train_worker.py, rank r
    in ``dirs[r]``: (the finished torchrun process, [rank 0's exit code, rank 1's])."""
    cfg = write_contract(tmp_path / "contract.yaml", raw)
    results = tmp_path / "results"
    results.mkdir()
    worker = [str(ROOT / "tests" / "dist_train_worker.py"), str(results), *map(str, dirs)]
    args = ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"]
    proc = subprocess.run([*TORCHRUN_2, *worker, *args], env=cpu_env(), capture_output=True, text=True, timeout=600)
    codes = [json.loads((results / f"rank{r}.json").read_text())["exit_code"] for r in (0, 1)]
    return proc, codes
