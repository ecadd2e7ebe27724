"""scripts/import_graph.py's issue-44 metrics, on a planted package whose every count is known by construction: a
61-line recipe function (and a 60-line one that must not count), a 451-line module (and a 450-line one), four
functions taking a ``Contract`` (by name, by annotation, by string annotation, as a method) beside two that must
not count, two edges that exist only inside functions, three underscore names crossing modules (by ``from``
import and by attribute on an imported module), three re-exports (``# noqa: F401``, ``__all__``, an ``__init__``)
and one upward edge."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import import_graph  # noqa: E402

LONG_61 = "def long_one():\n" + "    x = 0\n" * 59 + "    return x\n"
LONG_60 = "def sixty():\n" + "    y = 0\n" * 58 + "    return y\n"

FILES = {
    "__init__.py": '"""Top."""\n',
    "errors.py": "class BadInputError(Exception):\n    pass\n",
    "contract/__init__.py": '"""Contract."""\n',
    "contract/spec.py": "class Contract:\n    pass\n",
    "plan/__init__.py": '"""Plan."""\n',
    # errors: imported at module level and again inside a def (not inside-only); recipe.setup: inside only (in a
    # try), upward, and an underscore name used as an attribute of the imported module (crosses packages)
    "plan/steps.py": (
        "from dplora.errors import BadInputError\n\n\n"
        "def check():\n    from dplora.errors import BadInputError as again\n\n    return again\n\n\n"
        "def climb():\n    try:\n        import dplora.recipe.setup as setup\n    except ImportError:\n        raise\n"
        "    return setup._helper()\n"
    ),
    "recipe/__init__.py": '"""Recipe."""\n',
    "recipe/setup.py": (
        "from dplora.contract.spec import Contract\n\n\n"
        "def _helper():\n    return 1\n\n\n"
        'def annotated(x: "Contract | None", y: int):\n    return x, y\n\n\n'
        "class Holder:\n    def method(self, c: Contract):\n        return c\n\n\n"
        "def contracts_only(contracts, opt: SweepContractOpt = None):\n    return contracts\n"
    ),
    # an underscore name imported inside the package (a parenthesised from-import: the same AST node);
    # plan.steps imported only inside a def
    "recipe/train.py": (
        "from dplora.contract.spec import Contract\nfrom dplora.recipe.setup import (_helper)\n\n\n"
        "def run_training(contract, *, a, b=1, **kw):\n    return _helper()\n\n\n"
        "def lazy():\n    from dplora.plan import steps\n\n    return steps\n\n\n" + LONG_61 + "\n\n" + LONG_60
    ),
    "data/__init__.py": '"""Data."""\n',
    "data/cells.py": "def cut(text):\n    return text\n",
    "data/units.py": "from dplora.data.cells import cut  # noqa: F401 - re-exported\n",
    "release/__init__.py": '"""Release."""\n',
    "release/envelope.py": (
        "from dplora.data import cells\nfrom dplora.data.cells import cut as cut2\n\n"
        '__all__ = ["cut2", "seal"]\n\n\n'
        "def seal(contract):\n    return cells._private_thing\n"
    ),
    # go is re-exported; used_here is the __init__'s own use
    "engine/__init__.py": "from dplora.engine.step import go, used_here\n\n\ndef f():\n    return used_here()\n",
    "engine/step.py": "def go():\n    pass\n\n\ndef used_here():\n    pass\n" + "# pad\n" * 445,
    "engine/other.py": "# pad\n" * 450,
}


def plant(tmp_path: Path, files=FILES) -> Path:
    pkg = tmp_path / "dplora"
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


def test_planted_package_gives_the_counts_it_was_built_with(tmp_path):
    m = import_graph.metrics(plant(tmp_path))
    assert m["modules"] == 17
    assert m["edges"] == 9
    assert m["depth"] == 4
    assert m["longest_chain"] == [
        "dplora.recipe.train",
        "dplora.plan.steps",
        "dplora.recipe.setup",
        "dplora.contract.spec",
    ]
    assert m["cycles"] == []
    assert m["packages"]["(root)"] == {"modules": 2, "lines": 3}
    assert m["packages"]["engine"] == {"modules": 3, "lines": 5 + 451 + 450}
    assert m["packages"]["recipe"] == {"modules": 3, "lines": 1 + 18 + (14 + 61 + 2 + 60)}
    assert sorted(m["packages"]) == ["(root)", "contract", "data", "engine", "plan", "recipe", "release"]
    assert m["big_modules"] == [{"module": "dplora.engine.step", "lines": 451}]
    assert m["long_recipe_functions"] == [{"function": "dplora.recipe.train.long_one", "lines": 61}]
    assert m["contract_functions"] == {
        "count": 4,
        "per_package": {"recipe": 3, "release": 1},
        "functions": [
            "dplora.recipe.setup.Holder.method",
            "dplora.recipe.setup.annotated",
            "dplora.recipe.train.run_training",
            "dplora.release.envelope.seal",
        ],
    }
    assert m["inside_function_edges"] == {
        "count": 2,
        "of": 9,
        "edges": ["dplora.plan.steps -> dplora.recipe.setup", "dplora.recipe.train -> dplora.plan.steps"],
    }
    assert m["underscore_names"] == {
        "count": 3,
        "distinct": 2,
        "same_package": 1,
        "cross_package": 2,
        "names": [
            "dplora.plan.steps: dplora.recipe.setup._helper",
            "dplora.recipe.train: dplora.recipe.setup._helper",
            "dplora.release.envelope: dplora.data.cells._private_thing",
        ],
    }
    assert m["reexports"] == {
        "count": 3,
        "names": [
            "dplora.data.units: cut (from dplora.data.cells)",
            "dplora.engine: go (from dplora.engine.step)",
            "dplora.release.envelope: cut2 (from dplora.data.cells)",
        ],
    }
    assert m["init_imports"] == {"count": 1, "names": 2, "modules": ["dplora.engine"]}
    assert m["upward_edges"] == {"count": 1, "edges": ["dplora.plan.steps -> dplora.recipe.setup"]}
    assert m["run_training_parameters"] == 4


def test_each_count_follows_its_planted_cause(tmp_path):
    """Moving each planted cause away moves its count to zero (or down by one), so no count is a constant."""
    files = dict(FILES)
    files["recipe/train.py"] = (
        "from dplora.plan import steps\n\n\n"  # the lazy import now also at module level: an ordinary edge
        "def run_training(contract):\n    return steps\n\n\n"
        "def lazy():\n    from dplora.plan import steps\n\n    return steps\n\n\n" + LONG_60
    )
    files["plan/steps.py"] = "from dplora.errors import BadInputError\n"
    files["data/units.py"] = "from dplora.data.cells import cut\n\n\ndef use():\n    return cut\n"
    files["release/envelope.py"] = "from dplora.data import cells\n\n\ndef seal(c):\n    return cells.cut\n"
    files["engine/__init__.py"] = '"""Engine."""\n'
    files["engine/step.py"] = "# pad\n" * 450
    m = import_graph.metrics(plant(tmp_path, files))
    assert m["long_recipe_functions"] == []
    assert m["big_modules"] == []
    assert m["contract_functions"]["count"] == 3  # annotated, Holder.method, run_training
    assert m["inside_function_edges"]["count"] == 0
    assert m["underscore_names"]["count"] == 0
    assert m["reexports"]["count"] == 0
    assert m["init_imports"]["count"] == 0
    assert m["upward_edges"] == {"count": 0, "edges": []}
    assert m["run_training_parameters"] == 1
    text = import_graph.report(m)
    assert "upward edges: 0" in text and "re-exports: 0" in text
    assert "underscore names crossing modules: 0 (0 distinct names; 0 inside a package, 0 across packages)" in text


def test_class_body_import_is_not_inside_a_function_and_run_training_may_be_missing(tmp_path):
    files = {
        "__init__.py": "",
        "errors.py": "X = 1\n",
        "run/__init__.py": "",
        "run/loop.py": (
            "class Loop:\n    from dplora.errors import X\n\n    def go(self):\n        import dplora.errors\n"
        ),
    }
    m = import_graph.metrics(plant(tmp_path, files))
    assert m["inside_function_edges"] == {"count": 0, "of": 1, "edges": []}
    assert m["run_training_parameters"] is None
    assert "run_training parameters: not found" in import_graph.report(m)


def test_command_line_prints_the_old_lines_first_and_json_on_request(tmp_path):
    pkg = plant(tmp_path)
    script = str(ROOT / "scripts" / "import_graph.py")
    text = subprocess.run([sys.executable, script, str(pkg)], capture_output=True, text=True, check=True).stdout
    lines = text.splitlines()
    assert lines[:3] == ["modules: 17", "edges: 9", "depth: 4 modules (3 import edges)"]
    assert lines[4] == "cycles: 0"
    assert "functions taking a Contract: 4 (recipe 3, release 1)" in lines
    assert "edges only inside functions: 2 of 9" in lines
    assert "upward edges: 1" in lines and "run_training parameters: 4" in lines
    out = subprocess.run([sys.executable, script, str(pkg), "--json"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == import_graph.metrics(pkg)


def test_one_copy_of_the_stage_order():
    """One copy of the stage order, dplora/stages.py: tests/test_import_order.py and scripts/import_graph.py import
    its STAGES and define none."""
    for path in (ROOT / "tests" / "test_import_order.py", ROOT / "scripts" / "import_graph.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assigned = [n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))]
        names = {
            t.id for n in assigned for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if hasattr(t, "id")
        }
        assert "STAGES" not in names, path
        imported = {
            a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "dplora.stages" for a in n.names
        }
        assert "STAGES" in imported, path
    stages = ast.parse((ROOT / "dplora" / "stages.py").read_text(encoding="utf-8"))
    assert any(isinstance(n, ast.AnnAssign) and n.target.id == "STAGES" for n in stages.body)
