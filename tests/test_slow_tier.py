"""The fast tier (issue 44.6): tests/conftest.py marks the tests of ``tests/slow_tests.txt`` slow, in one place.

Checked here: how an entry matches a node id (a test entry covers its parametrizations and nothing longer); that the
hook marks a planted project's tests so that ``-m "not slow"`` and ``-m slow`` split it exactly; and that every entry
of the real list matches at least one collected test, so a renamed or deleted test cannot leave a stale entry that
marks nothing (the check is itself run on a planted stale entry).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import COLLECTED, SLOW_LIST, entry_matches, slow_entries

ROOT = Path(__file__).resolve().parents[1]


def stale_entries(entries: list[str], nodeids) -> list[str]:
    """The entries (in list order) that match none of ``nodeids``."""
    nodeids = list(nodeids)
    return [entry for entry in entries if not any(entry_matches(entry, nodeid) for nodeid in nodeids)]


def collect(args: list[str], cwd: Path, *extra: str) -> list[str]:
    """Node ids that ``pytest --collect-only -q`` selects for ``args`` (run in ``cwd``, a fresh process)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra, *args]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]  # 5: nothing selected
    return [line for line in done.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def test_entry_matching():
    module = "tests/run/test_x.py"
    assert entry_matches("tests/run/", f"{module}::test_y")
    assert not entry_matches("tests/ru/", f"{module}::test_y")
    assert not entry_matches("tests/run", f"{module}::test_y")  # a folder entry ends in /
    assert entry_matches(module, f"{module}::test_y")
    assert not entry_matches(module, "tests/run/test_x.pyc::test_y")
    assert entry_matches(f"{module}::test_y", f"{module}::test_y")
    assert entry_matches(f"{module}::test_y", f"{module}::test_y[a-1]")
    assert not entry_matches(f"{module}::test_y", f"{module}::test_y_more")
    assert entry_matches(f"{module}::TestZ", f"{module}::TestZ::test_y")
    assert not entry_matches(f"{module}::test_y[a-1]", f"{module}::test_y[a-2]")


def test_stale_entries_are_found():
    ids = ["tests/a/test_m.py::test_one", "tests/a/test_m.py::test_two[1]", "tests/b/test_n.py::test_three"]
    entries = ["tests/a/", "tests/a/test_m.py::test_two", "tests/a/test_m.py::test_gone", "tests/c/", "tests/b/test_n"]
    assert stale_entries(entries, ids) == ["tests/a/test_m.py::test_gone", "tests/c/", "tests/b/test_n"]
    assert stale_entries(entries[:2], ids) == []


def test_slow_entries_reads_comments_and_blank_lines(tmp_path):
    path = tmp_path / "slow.txt"
    path.write_text("# header\n\ntests/scripts/   # a folder\n  tests/x.py::test_y\n#tests/z.py\n")
    assert slow_entries(path) == ["tests/scripts/", "tests/x.py::test_y"]


PLANTED_CONFTEST = """
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("repo_conftest", {conftest!r})
repo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(repo)
repo.SLOW_LIST = Path(__file__).parent / "slow.txt"
pytest_collection_modifyitems = repo.pytest_collection_modifyitems
"""


def test_hook_marks_the_listed_tests_for_deselection(tmp_path):
    """A planted project using the real hook: the listed folder, module, test (all its params) and class are slow,
    everything else (``test_one_more``, the other class) is not, under both ``-m`` expressions."""
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmarkers = ["slow: slow"]\n')
    (tmp_path / "conftest.py").write_text(PLANTED_CONFTEST.format(conftest=str(ROOT / "tests" / "conftest.py")))
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "deep").mkdir()
    (tmp_path / "t" / "test_a.py").write_text(
        "import pytest\n\n"
        "def test_one():\n    pass\n\n"
        "def test_one_more():\n    pass\n\n"
        "@pytest.mark.parametrize('k', [1, 2])\ndef test_param(k):\n    pass\n\n"
        "class TestSlow:\n    def test_in(self):\n        pass\n\n"
        "class TestFast:\n    def test_in(self):\n        pass\n"
    )
    (tmp_path / "t" / "test_b.py").write_text("def test_b():\n    pass\n")
    (tmp_path / "t" / "deep" / "test_c.py").write_text("def test_c():\n    pass\n")
    (tmp_path / "slow.txt").write_text(
        "# planted\nt/deep/\nt/test_b.py\nt/test_a.py::test_one\nt/test_a.py::test_param\nt/test_a.py::TestSlow\n"
    )
    slow = {
        "t/deep/test_c.py::test_c",
        "t/test_b.py::test_b",
        "t/test_a.py::test_one",
        "t/test_a.py::test_param[1]",
        "t/test_a.py::test_param[2]",
        "t/test_a.py::TestSlow::test_in",
    }
    fast = {"t/test_a.py::test_one_more", "t/test_a.py::TestFast::test_in"}
    assert set(collect(["t"], tmp_path)) == slow | fast
    assert set(collect(["t"], tmp_path, "-m", "not slow")) == fast
    assert set(collect(["t"], tmp_path, "-m", "slow")) == slow


def _covered(config, path: Path) -> bool:
    """Whether this session was asked to collect all of ``path`` (a module or folder): one of its arguments, without
    ``::``, is ``path`` or a folder above it."""
    for arg in config.args:
        if "::" in arg:
            continue
        target = (Path(config.invocation_params.dir) / arg).resolve()
        if target == path or target in path.parents:
            return True
    return False


def test_every_slow_entry_matches_a_collected_test(request):
    """Entries under what this session collected in full are checked against its own collection (before ``-m``
    deselected anything); the rest are collected in a fresh process."""
    entries = slow_entries(SLOW_LIST)
    assert entries, "tests/slow_tests.txt lists no test"
    collected = request.config.stash.get(COLLECTED, ())
    here, elsewhere = [], []
    for entry in entries:
        where = entry.split("::", 1)[0]  # the entry's folder or module
        seen = any(entry_matches(where, nodeid) for nodeid in collected)
        (here if seen and _covered(request.config, (ROOT / where).resolve()) else elsewhere).append(entry)
    stale = stale_entries(here, collected)
    if elsewhere:
        paths = sorted({where for entry in elsewhere if (ROOT / (where := entry.split("::", 1)[0])).exists()})
        stale += stale_entries(elsewhere, collect(paths, ROOT) if paths else [])
    assert stale == [], f"entries of {SLOW_LIST.name} that match no collected test: {stale}"
