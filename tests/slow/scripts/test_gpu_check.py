"""``bash scripts/gpu_check.sh --dry-run`` (issues 30, 47, 65): every stage of the GPU check runs on CPU at toy
sizes, after the weights travel in parts as they would to a GPU machine; the check fits the device's limits.

The device runs a call for at most 600 s, brings back at most 8 files under $OUT and the output's last 12,000
characters, and a session has 15 minutes in all. So the check is one call (setup, train-bf16 with
``physical_batch_size: auto``, train-fp32 with TF32, fsdp, fastclip, noise, scale-1b at 512 tokens, plain and
4-bit) whose stage estimates sum to ≤ 540 s and whose timeouts fit 600 s, and a second, optional call
(``--second``: setup, scale-8b, utility). Tested here: ``--plan`` (the stage lists and the sums, which the script's
header states too), the dry run of each call (every stage OK, the 1B plain and 4-bit rows, the 8B checkpointing
rows, the one table; exactly three files under OUT_DIR: the table, the stage list and one archive of the logs), a
stage that fails on purpose (``GPU_CHECK_FAIL``) ends the script with 10 + its position and the files still come
back, and the wheels are pinned from the venv's ``pip freeze``. Before the first dry run,
``gpu_prepare.sh --weights-only`` splits a stand-in GGUF (random bytes) into parts; each ``gpu_check.sh --part K``
"call" sees only part K's folder copied in (the previous call's carry removed, as the device tool replaces carried
paths), and the dry run's setup joins the received parts and checks their sha256.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import SHARED

ROOT = Path(__file__).resolve().parents[3]
STAGES = ["setup", "train-bf16", "train-fp32", "fsdp", "fastclip", "noise", "scale-1b"]
SECOND = ["setup", "scale-8b", "utility"]
OUT_FILES = ["gpu_check.md", "logs.tar.gz", "stages.txt"]
MAX_FILES, MAX_ESTIMATE_S, MAX_TIMEOUTS_S = 8, 540, 580  # 600 s a call, 20 s kept for the exit trap
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


def _plan(*flags: str) -> tuple[list[str], int, int]:
    proc = _bash([str(ROOT / "scripts" / "gpu_check.sh"), "--plan", *flags], dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = re.findall(r"^PLAN (\S+)\s+estimate\s+\d+ s\s+timeout", proc.stdout, flags=re.M)
    est, lim = map(int, re.search(r"^PLAN total estimate (\d+) s, timeouts (\d+) s$", proc.stdout, flags=re.M).groups())
    return names, est, lim


def test_each_call_fits_the_device_and_the_header_states_the_plan():
    header = (ROOT / "scripts" / "gpu_check.sh").read_text().split("\nset -uo pipefail")[0]
    totals = re.findall(r"^#\s+total\s+(\d+) s\s+(\d+) s$", header, flags=re.M)
    for flags, stages, stated in (((), STAGES, totals[0]), (("--second",), SECOND, totals[1])):
        names, est, lim = _plan(*flags)
        assert names == stages
        assert est <= MAX_ESTIMATE_S and lim <= MAX_TIMEOUTS_S, (flags, est, lim)
        assert (str(est), str(lim)) == stated, (flags, est, lim, stated)
        for name in stages:  # every stage of the call has its row in the header's table
            assert re.search(rf"^#\s+{re.escape(name)}\s", header, flags=re.M), name


def test_no_pipe_hides_a_command_status():
    """pip install and dplora verify are never piped into another command (the pipe's status would be tail's or
    grep's): their output goes to a log that is read after their status is kept."""
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert "set -uo pipefail" in text
    for line in code:
        assert not re.search(r"(pip install|\$D verify|\$D train|utility_bench\.py)[^|#]*\|[^|]", line), line


def test_wheels_are_pinned_from_the_venv_freeze():
    proc = _bash([str(ROOT / "scripts" / "gpu_prepare.sh"), "--pins"], dict(os.environ, PYTHON=sys.executable))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    groups = dict(re.findall(r"^# (\w+)\n((?:[^#].*\n?)+)", proc.stdout, flags=re.M))
    assert set(groups) == {"CORE", "STACK", "BNB"}
    pinned = {}
    for block in groups.values():
        for line in block.split():
            name, _, version = line.partition("==")
            assert version and re.match(r"^[0-9]", version), line
            pinned[name] = version
    from importlib.metadata import version

    for name in ("pydantic-core", "dill", "multiprocess", "cryptography", "transformers", "kernels", "bitsandbytes"):
        assert pinned.get(name) == version(name).split("+")[0], name
    assert "bitsandbytes==" in groups["BNB"] and "kernels==" in groups["STACK"] and "transformers==" in groups["STACK"]


def _dry_env(tmp_path: Path, device: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    env.update(PYTHON=sys.executable, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path), **extra)
    env["GPU_DIR"] = str(device if device is not None else tmp_path / "none" / ".gpu")
    return env


def _summary(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^STAGE ([\w-]+): (OK|FAIL|SKIP)", stdout, flags=re.M))


def _out_files(out: Path) -> list[str]:
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert len(files) <= MAX_FILES, files
    return files


def _archived(out: Path, member: str) -> str:
    with tarfile.open(out / "logs.tar.gz") as tar:
        return tar.extractfile(f"./{member}").read().decode()


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils")
def test_dry_run_reports_every_stage_ok(tmp_path):
    pytest.importorskip("bitsandbytes")  # the 4-bit rows; CI installs the quant extra
    local, data = _prepare_parts(tmp_path)
    device = tmp_path / "device" / ".gpu"
    _send_parts(local, device, 3)
    out = tmp_path / "out"
    proc = _bash([str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out)], _dry_env(tmp_path, device), 1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert _summary(proc.stdout) == {s: "OK" for s in STAGES}, _summary(proc.stdout)
    est = int(re.search(r"estimated GPU total (\d+) s", proc.stdout)[1])
    assert est <= MAX_ESTIMATE_S
    assert "overall exit 0" in proc.stdout
    assert f"weights: {NAME} joined from 3 parts, {len(data)} bytes, sha256 OK" in proc.stdout
    assert _out_files(out) == OUT_FILES
    assert re.findall(r"^STAGE ([\w-]+):", (out / "stages.txt").read_text(), flags=re.M) == STAGES
    assert "physical batch: 8 records per forward (probed on synthetic batches)" in proc.stdout  # auto on CPU
    assert "TF32 off" in _archived(out, "train-fp32.txt")
    rows = _archived(out, "scale-llama-1b/scale.md")
    assert re.search(r"\| 4bit \| dplora_fast \| 2 \| [0-9.]+ \|", rows), rows
    assert re.search(r"\| plain \| non_dp \| 2 \| [0-9.]+ \|", rows), rows
    # one table ends the check (issue 47): every stage, the DP/non-DP ratios and the noise per step
    table = (out / "gpu_check.md").read_text()
    assert table in proc.stdout
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:] if line.split("|")[1].strip()] == STAGES
    assert re.search(r"\| seq 16 4bit B 2 \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \|", table), table
    assert re.search(r"\| P 20,000 \(cpu\) \|(\s+\|){4}\s+[0-9.]+ \(", table), table


def test_dry_run_of_the_second_call(tmp_path):
    out = tmp_path / "out"
    env = _dry_env(tmp_path)
    # the utility stage reads Bitext from ../shared, which a fresh clone lacks: it then reports SKIP, the rest runs
    utility_data = Path(env.setdefault("DPLORA_UTILITY_DATA", str(SHARED / "data")))
    has_bitext = (utility_data / "bitext_customer_support").is_dir()
    proc = _bash([str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--second", str(out)], env, 1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    expected = {s: "OK" for s in SECOND} | ({} if has_bitext else {"utility": "SKIP"})
    assert _summary(proc.stdout) == expected, _summary(proc.stdout)
    assert _out_files(out) == OUT_FILES
    ckpt = _archived(out, "scale-llama-8b/scale.md")
    assert re.search(r"\| ckpt \| dplora_fast \| 2 \| [0-9.]+ \|", ckpt), ckpt
    table = (out / "gpu_check.md").read_text()
    if not has_bitext:
        assert f"STAGE utility: SKIP (no Bitext data at {utility_data / 'bitext_customer_support'})" in proc.stdout
        pytest.skip(f"the utility stage's rows need Bitext in {utility_data} (every other stage ran and passed)")
    assert re.search(r"\| bitext dp-\S+ ε 8(\.0)? \|(\s+\|){5}\s+loss [0-9.]+ \|", table), table


@pytest.mark.parametrize(
    ("fail", "only", "status", "expected"),
    [
        # a failed setup: its own status (10 + position 0), the rest skipped, the files still come back
        ("setup", "", 10, {"setup": "FAIL"} | {s: "SKIP" for s in STAGES[1:]}),
        # a later stage: 10 + its position in the call's list, whatever the stages after it do
        ("noise", "noise", 10 + STAGES.index("noise"), {"setup": "OK", "noise": "FAIL"}),
    ],
)
def test_a_failing_stage_fails_the_script_and_the_files_come_back(tmp_path, fail, only, status, expected):
    out = tmp_path / "out"
    env = _dry_env(tmp_path, GPU_CHECK_FAIL=fail, GPU_CHECK_ONLY=only)
    proc = _bash([str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out)], env, 900)
    assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = _summary(proc.stdout)
    assert {k: v for k, v in summary.items() if v != "SKIP" or k in expected} == expected, summary
    assert list(summary) == STAGES
    assert f"overall exit {status}" in proc.stdout
    assert _out_files(out) == OUT_FILES
    assert f"STAGE {fail}: FAIL (exit 3," in (out / "stages.txt").read_text()


def test_a_wheel_that_does_not_install_fails_setup_with_its_own_status(tmp_path):
    """The real (not dry) setup on this CPU machine: a broken wheel makes pip fail, and pip's status, not a pipe's,
    ends setup (exit 10, the rest skipped), with pip's log shown and the three files back."""
    gpu = tmp_path / ".gpu"
    (gpu / "wheels").mkdir(parents=True)
    (gpu / "wheels" / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    out = tmp_path / "out"
    env = _dry_env(tmp_path, gpu, SITE=str(tmp_path / "site"), RECEIVED_WHEELS=str(tmp_path / "none"))
    proc = _bash([str(ROOT / "scripts" / "gpu_check.sh"), str(out)], env, 300)
    assert proc.returncode == 10, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "pip install: FAIL" in proc.stdout
    assert _summary(proc.stdout) == {"setup": "FAIL"} | {s: "SKIP" for s in STAGES[1:]}
    assert _out_files(out) == OUT_FILES


def test_receive_wheels_checks_and_keeps_the_wheels(tmp_path):
    bnb = tmp_path / ".gpu" / "wheels-bnb"
    bnb.mkdir(parents=True)
    wheel = bnb / "bitsandbytes-0.0-py3-none-any.whl"
    wheel.write_bytes(b"stand-in")
    (bnb / "SHA256SUMS").write_text(f"{hashlib.sha256(b'stand-in').hexdigest()}  ./{wheel.name}\n")
    kept = tmp_path / "kept"
    env = dict(os.environ, GPU_DIR=str(tmp_path / ".gpu"), RECEIVED_WHEELS=str(kept))
    proc = _bash([str(ROOT / "scripts" / "gpu_check.sh"), "--receive-wheels"], env)
    assert proc.returncode == 0 and proc.stdout.startswith("WHEELS: OK"), proc.stdout + proc.stderr
    assert [p.name for p in kept.iterdir()] == [wheel.name]
    wheel.write_bytes(b"changed")
    proc = _bash([str(ROOT / "scripts" / "gpu_check.sh"), "--receive-wheels"], env)
    assert proc.returncode == 1 and "WHEELS: FAIL (sha256)" in proc.stdout
