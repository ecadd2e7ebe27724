"""``bash scripts/gpu_check.sh --dry-run`` (issue 30): every stage of the GPU check runs on CPU at toy sizes.

The dry run builds the tests' tiny Llama, trains and verifies it in bf16 (2 steps), checks the fast path against
the one-record reference (scripts/check_fastclip.py --toy), runs scripts/bench_scale.py on a toy shape for the
1B and 8B stages (plain, 4-bit; the checkpointing row is skipped until ``training.gradient_checkpointing`` is a
contract key) and the utility bench's --full design at toy size (--toy --full on Bitext, ε = 8, 1 repeat). Each
stage must report OK, the script exit 0, and the 1B stage's table hold measured plain and 4-bit rows. About 95 s of
CPU time (6 min wall on the shared 2-core machine), plus about 45 s for the utility stage.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["setup", "train-bf16", "fastclip", "scale-1b", "scale-8b", "utility"]

pytest.importorskip("bitsandbytes")  # the 4-bit rows; CI installs the quant extra


def _run(root: Path, out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", TMPDIR=str(out.parent))
    return subprocess.run(
        ["bash", str(root / "scripts" / "gpu_check.sh"), "--dry-run", str(out)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )


def test_dry_run_reports_every_stage_ok(tmp_path):
    proc = _run(ROOT, tmp_path / "out")
    summary = dict(re.findall(r"^STAGE ([\w-]+): (OK|FAIL|SKIP)", proc.stdout, flags=re.M))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert all(summary.get(s) == "OK" for s in STAGES), summary
    assert "overall exit 0" in proc.stdout
    rows = (tmp_path / "out" / "scale-llama-1b" / "scale.md").read_text()
    assert re.search(r"\| 4bit \| dplora_fast \| 2 \| [0-9.]+ \|", rows), rows
    assert re.search(r"\| plain \| non_dp \| 2 \| [0-9.]+ \|", rows), rows
