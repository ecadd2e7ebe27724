"""``bash scripts/gpu_check.sh --dry-run`` (issues 30, 47): every stage of the GPU check runs on CPU at toy sizes,
after the weights travel in parts as they would to a GPU machine.

The dry run builds the tests' tiny Llama, trains and verifies it in bf16 (2 steps), checks the fast path against
the one-record reference (scripts/check_fastclip.py --toy), runs scripts/bench_scale.py on a toy shape for the
1B stage (plain and 4-bit rows, with the largest-batch search) and the 8B stage (the checkpointing rows), so each
variant runs once, and the utility bench's --full design at toy size (--toy --full on Bitext, ε = 8, 1 repeat).
Before it, ``gpu_prepare.sh --weights-only`` splits a stand-in GGUF (random bytes) into parts; each
``gpu_check.sh --part K`` "call" sees only part K's folder copied in (the previous call's carry removed, as the
device tool replaces carried paths), and the dry run's setup joins the received parts and checks their sha256.
Each stage must report OK, the script exit 0, and the 1B stage's table hold measured plain and 4-bit rows.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["setup", "train-bf16", "fsdp", "fastclip", "scale-1b", "scale-8b", "noise", "utility"]
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _bash(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _prepare_parts(tmp: Path, size: int = 2500, part_bytes: int = 1000) -> tuple[Path, bytes]:
    """A stand-in GGUF of ``size`` random bytes split by gpu_prepare.sh into ⌈size / part_bytes⌉ parts."""
    data = os.urandom(size)
    (tmp / "src").mkdir()
    (tmp / "src" / NAME).write_bytes(data)
    local = tmp / "local" / ".gpu"
    env = dict(os.environ, GPU_DIR=str(local), GGUF=str(tmp / "src" / NAME), PART_BYTES=str(part_bytes))
    proc = _bash([str(ROOT / "scripts" / "gpu_prepare.sh"), "--weights-only"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return local, data


def _send_parts(local: Path, device: Path, n: int) -> list[str]:
    """The documented calls, one per part: copy .gpu/weights-K in (dropping call K−1's), run --part K."""
    out = []
    for k in range(1, n + 1):
        shutil.rmtree(device / f"weights-{k - 1}", ignore_errors=True)
        shutil.copytree(local / f"weights-{k}", device / f"weights-{k}")
        proc = _bash([str(ROOT / "scripts" / "gpu_check.sh"), "--part", str(k)], dict(os.environ, GPU_DIR=str(device)))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out.append(proc.stdout)
    return out


def test_prepare_splits_the_weights_into_checked_parts_and_part_k_receives_them(tmp_path):
    local, data = _prepare_parts(tmp_path)
    parts = sorted(local.glob("weights-*"))
    assert [p.name for p in parts] == ["weights-1", "weights-2", "weights-3"]
    joined = b"".join((local / f"weights-{k}" / f"{NAME}.part-{k}").read_bytes() for k in (1, 2, 3))
    assert joined == data and len((local / "weights-3" / f"{NAME}.part-3").read_bytes()) == 500
    whole = (local / "weights-2" / "weights.sha256").read_text().split()
    assert whole == [hashlib.sha256(data).hexdigest(), NAME]
    device = tmp_path / "device" / ".gpu"
    logs = _send_parts(local, device, 3)
    assert logs[0].startswith("PART 1 of 3: OK (1000 bytes, sha256 checked)")
    assert sorted(p.name for p in (device / "received").iterdir()) == sorted(
        [f"{NAME}.part-{k}" for k in (1, 2, 3)]
        + [f"part-{k}.sha256" for k in (1, 2, 3)]
        + ["weights.parts", "weights.sha256"]
    )


def test_a_corrupted_or_missing_part_is_refused(tmp_path):
    local, _ = _prepare_parts(tmp_path)
    part = local / "weights-2" / f"{NAME}.part-2"
    part.write_bytes(b"x" + part.read_bytes()[1:])
    env = dict(os.environ, GPU_DIR=str(local))
    proc = _bash([str(ROOT / "scripts" / "gpu_check.sh"), "--part", "2"], env)
    assert proc.returncode == 1 and "PART 2: FAIL (sha256 of the part)" in proc.stdout
    assert not (local / "received").exists()
    proc = _bash([str(ROOT / "scripts" / "gpu_check.sh"), "--part", "4"], env)
    assert proc.returncode == 2 and "weights-4" in proc.stderr
    proc = _bash([str(ROOT / "scripts" / "gpu_check.sh"), "--part", "x"], env)
    assert proc.returncode == 2


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils")
def test_dry_run_reports_every_stage_ok(tmp_path):
    pytest.importorskip("bitsandbytes")  # the 4-bit rows; CI installs the quant extra
    local, data = _prepare_parts(tmp_path)
    device = tmp_path / "device" / ".gpu"
    _send_parts(local, device, 3)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path), GPU_DIR=str(device))
    # the utility stage reads Bitext from ../shared, which a fresh clone lacks: it then reports SKIP, the rest runs
    utility_data = Path(env.setdefault("DPLORA_UTILITY_DATA", str(SHARED / "data")))
    has_bitext = (utility_data / "bitext_customer_support").is_dir()
    proc = _bash([str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out)], env, timeout=1800)
    summary = dict(re.findall(r"^STAGE ([\w-]+): (OK|FAIL|SKIP)", proc.stdout, flags=re.M))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    expected = {s: "OK" for s in STAGES} | ({} if has_bitext else {"utility": "SKIP"})
    assert summary == expected, summary
    if not has_bitext:
        assert f"STAGE utility: SKIP (no Bitext data at {utility_data / 'bitext_customer_support'})" in proc.stdout
    assert "overall exit 0" in proc.stdout
    assert f"weights: {NAME} joined from 3 parts, {len(data)} bytes, sha256 OK" in proc.stdout
    rows = (out / "scale-llama-1b" / "scale.md").read_text()
    assert re.search(r"\| 4bit \| dplora_fast \| 2 \| [0-9.]+ \|", rows), rows
    assert re.search(r"\| plain \| non_dp \| 2 \| [0-9.]+ \|", rows), rows
    ckpt = (out / "scale-llama-8b" / "scale.md").read_text()
    assert re.search(r"\| ckpt \| dplora_fast \| 2 \| [0-9.]+ \|", ckpt), ckpt
    # one table ends the check (issue 47): every stage, the DP/non-DP ratios, the noise per step and the utility rows
    table = (out / "gpu_check.md").read_text()
    assert table in proc.stdout
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:] if line.split("|")[1].strip()] == STAGES
    assert re.search(r"\| seq 16 4bit B 2 \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|", table), table
    assert re.search(r"\| P 20,000 \(cpu\) \|(\s+\|){4}\s+[0-9.]+ \(", table), table
    if not has_bitext:
        pytest.skip(f"the utility stage's rows need Bitext in {utility_data} (every other stage ran and passed)")
    assert re.search(r"\| bitext dp-\S+ ε 8(\.0)? \|(\s+\|){5}\s+loss [0-9.]+ \|", table), table
