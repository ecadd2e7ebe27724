"""Every test that reads the real datasets beside the repository (``../shared``) passes or skips without them.

A fresh clone has no ``../shared``. This runs, once per CI run, each test that refers to the shared data (found by
what it names, so a new one is picked up) in a fresh pytest process with ``DPLORA_SHARED_DIR`` pointed at an empty
folder: the real folder stays in place for other jobs. The tests are found in two steps: the modules that name the
data, then, in each, the tests that name it, directly or through a module-level helper, fixture or import that
does (the rest of such a module never reads the data, and ran once already): 46 of 82 tests, about 20 s on one core
(100 s when whole modules ran). They include the GPU check's second dry run, whose utility stage must report SKIP
while every other stage passes.
"""

from __future__ import annotations

import ast
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
    names = "|".join(map(re.escape, sorted(_support_readers()))) or "$^"  # "$^": no support module reads it
    via_support = re.compile(rf"^from support\.({names}) import", re.M)

    def reads(text: str) -> bool:
        return bool(READS_SHARED.search(text) or via_support.search(text))

    return sorted(
        path for path in TESTS.rglob("test_*.py") if path.name not in NOT_TESTS and reads(path.read_text("utf-8"))
    )


def _support_readers() -> set[str]:
    return {p.stem for p in (TESTS / "support").glob("*.py") if READS_SHARED.search(p.read_text(encoding="utf-8"))}


def shared_reading_tests(path: Path) -> list[str]:
    """The node ids (``path::name``) of the tests in module ``path`` that name the shared data: in their own text
    (decorators included), through a module-level name that does (a helper, a constant, a fixture, transitively),
    through a fixture argument of that kind, or through a name imported from a tests/support module that reads it.
    A module whose ``pytestmark`` reads it gives every test."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    support = _support_readers()
    reading: set[str] = set()
    defined: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.removeprefix("support.") in support:
            reading |= {a.asname or a.name for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {t.id: node for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom) and READS_SHARED.search(ast.get_source_segment(text, node)):
            reading |= {(a.asname or a.name).split(".")[0] for a in node.names}

    def names(node) -> set[str]:
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            used |= {a.arg for a in node.args.args + node.args.kwonlyargs}  # fixtures by argument name
        return used

    reading |= {name for name, node in defined.items() if READS_SHARED.search(ast.get_source_segment(text, node))}
    while True:  # the closure over module-level names
        more = {name for name, node in defined.items() if name not in reading and names(node) & reading}
        if not more:
            break
        reading |= more
    tests = [name for name in defined if name.startswith(("test_", "Test"))]
    chosen = tests if "pytestmark" in reading else [name for name in tests if name in reading]
    return [f"{path}::{name}" for name in chosen]


def test_the_selection_finds_a_test_through_a_helper_and_leaves_the_others(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text(
        "from conftest import SHARED\n"
        "DATA = SHARED / 'data'\n"
        "def _rows():\n    return list(DATA.iterdir())\n"
        "def rows():\n    return _rows()\n"
        "import pytest\n"
        "@pytest.fixture\ndef table():\n    return rows()\n"
        "def test_direct():\n    assert SHARED\n"
        "def test_through_two_helpers():\n    assert rows()\n"
        "def test_through_a_fixture(table):\n    assert table\n"
        "def test_none():\n    assert 1\n"
        "class TestBox:\n    def test_in_class(self):\n        assert rows()\n"
    )
    got = [n.split("::")[1] for n in shared_reading_tests(planted)]
    assert got == ["test_direct", "test_through_two_helpers", "test_through_a_fixture", "TestBox"]
    planted.write_text(planted.read_text() + "pytestmark = pytest.mark.skipif(not DATA.exists(), reason='x')\n")
    assert len(shared_reading_tests(planted)) == 5


def test_the_tests_that_read_the_shared_data_pass_or_skip_without_it(tmp_path):
    modules = modules_that_read_shared()
    assert len(modules) >= 8, modules  # the Bitext, Banking77 and TWCS readers, fast and slow
    selected = [node for path in modules for node in shared_reading_tests(path)]
    assert all(any(node.startswith(f"{m}::") for node in selected) for m in modules), selected
    empty = tmp_path / "no-shared"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "DPLORA_UTILITY_DATA"} | {"DPLORA_SHARED_DIR": str(empty)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *selected]
    proc = subprocess.run(cmd, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=1200)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    assert " failed" not in summary and " error" not in summary, summary
    skipped = int(re.search(r"(\d+) skipped", summary).group(1))
    assert skipped >= 20, summary  # the tests that need the data did skip, with the folder named
    assert str(empty) in proc.stdout, tail
