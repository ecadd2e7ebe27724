"""The fast tier: tests/conftest.py marks a test slow exactly when its file lives under tests/slow/.

Checked here: the path rule itself; that the hook, run on a planted project, splits it exactly under both ``-m``
expressions; and that the real tree keeps the rule (no test outside tests/slow/ carries the slow mark by hand, and
every folder of tests/slow/ is a package, so its modules may share a name with their fast tier's module).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from conftest import SLOW_DIR, in_slow_tier

ROOT = Path(__file__).resolve().parents[1]


def collect(args: list[str], cwd: Path, *extra: str) -> list[str]:
    """Node ids that ``pytest --collect-only -q`` selects for ``args`` (run in ``cwd``, a fresh process)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra, *args]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]  # 5: nothing selected
    return [line for line in done.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def test_the_path_rule(tmp_path):
    slow = tmp_path / "slow"
    assert in_slow_tier(slow / "run" / "test_x.py", slow)
    assert in_slow_tier(slow / "test_x.py", slow)
    assert not in_slow_tier(tmp_path / "run" / "test_x.py", slow)
    assert not in_slow_tier(tmp_path / "slower" / "test_x.py", slow)  # a folder whose name starts the same
    assert not in_slow_tier(tmp_path / "run" / "slow" / "test_x.py", slow)  # another folder named slow


PLANTED_CONFTEST = """
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("repo_conftest", {conftest!r})
repo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(repo)
repo.SLOW_DIR = Path(__file__).parent / "t" / "slow"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if repo.in_slow_tier(item.path, repo.SLOW_DIR):
            item.add_marker(__import__("pytest").mark.slow)
"""


def test_hook_marks_the_slow_folder_for_deselection(tmp_path):
    """A planted project using the real rule: every test under t/slow/ (at any depth, including a module that shares
    its name with a fast one) is slow, everything else is not, under both ``-m`` expressions."""
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmarkers = ["slow: slow"]\n')
    (tmp_path / "conftest.py").write_text(PLANTED_CONFTEST.format(conftest=str(ROOT / "tests" / "conftest.py")))
    for folder in ("t/run", "t/slow/run"):
        (tmp_path / folder).mkdir(parents=True)
    for folder in ("t/slow", "t/slow/run"):
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "t" / "run" / "test_a.py").write_text("def test_one():\n    pass\n")
    (tmp_path / "t" / "slow" / "run" / "test_a.py").write_text("def test_one():\n    pass\n")
    (tmp_path / "t" / "slow" / "test_b.py").write_text("def test_b():\n    pass\n")
    slow = {"t/slow/run/test_a.py::test_one", "t/slow/test_b.py::test_b"}
    fast = {"t/run/test_a.py::test_one"}
    assert set(collect(["t"], tmp_path)) == slow | fast
    assert set(collect(["t"], tmp_path, "-m", "not slow")) == fast
    assert set(collect(["t"], tmp_path, "-m", "slow")) == slow


def test_the_tree_keeps_the_rule():
    """No test module outside tests/slow/ marks a test slow by hand (the folder is the only tier switch), the old
    hand-kept id list is gone, and every folder under tests/slow/ has an ``__init__.py``."""
    marked = []
    for path in (ROOT / "tests").rglob("test_*.py"):
        if in_slow_tier(path, SLOW_DIR):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "slow" and ast.unparse(node) == "pytest.mark.slow":
                marked.append(str(path.relative_to(ROOT)))
    assert marked == []
    assert not (ROOT / "tests" / "slow_tests.txt").exists()
    folders = [SLOW_DIR, *(p for p in SLOW_DIR.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    assert [str(p) for p in folders if not (p / "__init__.py").exists()] == []
    assert len(folders) > 10


def test_every_test_file_the_docs_cite_exists():
    """A test moved between tiers or folders leaves no stale path in the docs, the README, the scripts or the code
    (docs/sharp_edges.md cites the test that holds each finding)."""
    import re

    cited = set()
    for folder in ("docs", "examples", "scripts", "dplora"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".md", ".py", ".sh", ".yaml", ".yml") and path.is_file():
                cited |= set(re.findall(r"tests/[A-Za-z0-9_/]+\.py", path.read_text(encoding="utf-8")))
    cited |= set(re.findall(r"tests/[A-Za-z0-9_/]+\.py", (ROOT / "README.md").read_text(encoding="utf-8")))
    assert len(cited) > 20
    assert sorted(p for p in cited if not (ROOT / p).is_file()) == []
