"""Tests that read the real datasets beside the repository (``../shared``, absent from a fresh clone) find them
through ``tests/conftest.py``'s ``SHARED``, which ``DPLORA_SHARED_DIR`` moves, so that one run with it pointed at
an empty folder checks that each of them skips without the data (the real folder stays in place for other jobs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# a path to ../shared spelled in a test instead of read from conftest.SHARED
OWN_PATH = re.compile(r"""/work/shared|/ ["']shared["']|["']\.\./shared/""")


def test_no_test_spells_its_own_path_to_the_shared_data():
    found = [
        f"{path.relative_to(TESTS)}:{number}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.name not in ("conftest.py", Path(__file__).name)
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if OWN_PATH.search(line) and not line.lstrip().startswith("#")
    ]
    assert found == []


def test_dplora_shared_dir_moves_the_folder_and_the_scripts_data(tmp_path):
    """conftest reads DPLORA_SHARED_DIR at import and points the scripts' DPLORA_UTILITY_DATA at its data folder."""
    code = (
        "import os, conftest; print(conftest.SHARED); print(os.environ['DPLORA_UTILITY_DATA']); "
        "m = conftest.needs_shared('data', 'banking77'); print(m.args, m.kwargs['reason'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "DPLORA_UTILITY_DATA"} | {"DPLORA_SHARED_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=TESTS, env=env, capture_output=True, text=True, check=True, timeout=120
    )
    assert proc.stdout.splitlines() == [
        str(tmp_path),
        str(tmp_path / "data"),
        f"(True,) {tmp_path / 'data' / 'banking77'} is absent (../shared is not part of a clone)",
    ]
