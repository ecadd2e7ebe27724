"""Every test that reads the real datasets beside the repository (``../shared``) passes or skips without them.

A fresh clone has no ``../shared``. This runs, once per CI run, each test module that refers to the shared data
(found by what it names, so a new one is picked up) in a fresh pytest process with ``DPLORA_SHARED_DIR`` pointed at
an empty folder: the real folder stays in place for other jobs. About 100 s on one core, most of it the GPU check's
dry run, whose utility stage must report SKIP while every other stage passes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
READS_SHARED = re.compile(r"\bSHARED\b|needs_shared|DPLORA_UTILITY_DATA|utility_bench")
NOT_TESTS = ("conftest.py", "test_shared_data.py")  # the reader itself and this check


def modules_that_read_shared() -> list[Path]:
    """The test modules (fast and slow tiers) that name the shared data, or import a tests/support module that
    does, sorted."""
    support = {p.stem for p in (TESTS / "support").glob("*.py") if READS_SHARED.search(p.read_text(encoding="utf-8"))}
    names = "|".join(map(re.escape, sorted(support))) or "$^"  # "$^": no support module reads it
    via_support = re.compile(rf"^from support\.({names}) import", re.M)

    def reads(text: str) -> bool:
        return bool(READS_SHARED.search(text) or via_support.search(text))

    return sorted(
        path for path in TESTS.rglob("test_*.py") if path.name not in NOT_TESTS and reads(path.read_text("utf-8"))
    )


def test_the_tests_that_read_the_shared_data_pass_or_skip_without_it(tmp_path):
    modules = modules_that_read_shared()
    assert len(modules) >= 8, modules  # the Bitext, Banking77 and TWCS readers, fast and slow
    empty = tmp_path / "no-shared"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "DPLORA_UTILITY_DATA"} | {"DPLORA_SHARED_DIR": str(empty)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *map(str, modules)]
    proc = subprocess.run(cmd, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=1200)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    assert " failed" not in summary and " error" not in summary, summary
    skipped = int(re.search(r"(\d+) skipped", summary).group(1))
    assert skipped >= 20, summary  # the tests that need the data did skip, with the folder named
    assert str(empty) in proc.stdout, tail
