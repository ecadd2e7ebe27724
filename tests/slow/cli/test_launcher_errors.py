"""The slow tier of tests/cli/test_launcher_errors.py, whose docstring describes the module."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import contract_dict, write_contract
from support.torchrun import ROOT, TORCHRUN_2, cpu_env


@pytest.mark.parametrize("case", ["unknown key", "bad override", "missing data file"])
def test_torchrun_two_processes_print_one_line_for_bad_input(case, tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """Two gloo processes of ``torchrun -m dplora train`` with a bad input: one dplora line, no dplora traceback,
    every process exits 2 (or is stopped by torchrun once another exited), torchrun exits 1, nothing written."""
    out = tmp_path / "run"
    data = tmp_path / "missing.csv" if case == "missing data file" else tickets_csv
    raw = contract_dict(tiny_model_dir, data, out, privacy={"num_units": 120})
    if case == "unknown key":
        raw["training"]["bogus"] = 1
    cfg = write_contract(tmp_path / "contract.yaml", raw)
    extra = ["training.lr=abc"] if case == "bad override" else []
    expected = {
        "unknown key": "error: contract: unknown key 'training.bogus'; every key: docs/contract.md",
        "bad override": "error: contract: training.lr='abc': must be a number (no quotes), or 'auto'",
        "missing data file": f"error: data file not found: {data}",
    }[case]
    cmd = [*TORCHRUN_2, "-m", "dplora"]
    args = ["train", str(cfg), *extra, "--signing-key", str(signing_key[0]), "--no-progress"]
    proc = subprocess.run([*cmd, *args], env=cpu_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]  # torchrun's own status when a process failed
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert lines == [expected], proc.stderr[-2000:]
    assert str(ROOT / "dplora") not in proc.stderr  # torch's launcher frames only, never dplora's
    codes = re.findall(r"^ +exitcode +: (-?\d+)", proc.stderr, flags=re.M)  # torchrun's summary, one entry per process
    # a process the agent stops once the other exited: -15 while it exits, 130 (silent) if still reading its input
    assert len(codes) == 2 and "2" in codes and set(codes) <= {"2", "-15", "130"}, proc.stderr[-2000:]
    assert proc.stdout == ""
    assert not out.exists() and not out.with_name("run.partial").exists()
