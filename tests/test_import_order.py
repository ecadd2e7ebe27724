"""The package layout stays one-way: no import cycle, no import against the stage order (issue 24).

Every module's imports are read with ``ast`` (imports inside functions included) by ``scripts/import_graph.py``.
A module may import its own stage and the stages below it, never one above it. The order, lowest first:

    core (dplora, errors, signals, atomic, surface) → accounting → contract → plan → data → engine → run →
    release → ledger → evaluate → recipe → audit, synth, export, tuning → cli (and ``python -m dplora``)

The checker itself is tested on planted graphs and on a planted upward import in a temporary package, so the
test on the real tree cannot pass by checking nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from import_graph import cycles, module_imports  # noqa: E402

# Lowest first; a module belongs to the stage of its longest matching dotted prefix.
STAGES: list[tuple[str, ...]] = [
    ("dplora", "dplora.errors", "dplora.signals", "dplora.atomic", "dplora.surface"),
    ("dplora.accounting",),
    ("dplora.contract",),
    ("dplora.plan",),
    ("dplora.data",),
    ("dplora.engine",),
    ("dplora.run",),
    ("dplora.release",),
    ("dplora.ledger",),
    ("dplora.evaluate",),
    ("dplora.recipe",),
    ("dplora.audit", "dplora.synth", "dplora.export", "dplora.tuning"),
    ("dplora.cli", "dplora.__main__"),
]


def stage_of(module: str, stages=STAGES) -> int:
    """Index in ``stages`` of the longest dotted prefix of ``module`` (the root ``dplora`` only as itself); KeyError
    when no stage names it."""
    best, rank = -1, None
    for i, names in enumerate(stages):
        for name in names:
            inside = module == name or (name != "dplora" and module.startswith(name + "."))
            if inside and len(name) > best:
                best, rank = len(name), i
    if rank is None:
        raise KeyError(module)
    return rank


def upward_imports(graph: dict[str, set[str]], stages=STAGES) -> list[str]:
    """Each ``importer -> imported`` edge whose target sits in a higher stage than its source, sorted."""
    return sorted(
        f"{src} -> {dst}"
        for src, dsts in graph.items()
        for dst in dsts
        if stage_of(dst, stages) > stage_of(src, stages)
    )


def test_every_module_has_a_stage():
    graph = module_imports(ROOT / "dplora")
    assert len(graph) > 60
    for module in graph:
        stage_of(module)  # raises KeyError for a module outside every stage


def test_no_import_cycles():
    assert cycles(module_imports(ROOT / "dplora")) == []


def test_no_import_against_the_stage_order():
    assert upward_imports(module_imports(ROOT / "dplora")) == []


def test_checker_finds_planted_cycles_and_upward_edges():
    graph = {
        "dplora.engine.step": {"dplora.engine.gradcheck", "dplora.release.record"},
        "dplora.engine.gradcheck": {"dplora.engine.step"},
        "dplora.release.record": {"dplora.plan.training"},
        "dplora.plan.training": set(),
    }
    assert cycles(graph) == [["dplora.engine.gradcheck", "dplora.engine.step"]]
    assert upward_imports(graph) == ["dplora.engine.step -> dplora.release.record"]
    assert upward_imports({"dplora.release.record": {"dplora.plan.training"}, "dplora.plan.training": set()}) == []
    with pytest.raises(KeyError):
        stage_of("dplora.nowhere")


def test_checker_finds_a_planted_upward_import_in_a_package(tmp_path):
    """A copy of two stages where the lower one imports the higher one inside a function."""
    pkg = tmp_path / "dplora"
    for sub in ("plan", "engine"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text('"""Stage."""\n')
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "step.py").write_text("from dplora.plan.training import TrainingPlan\n")
    (pkg / "plan" / "training.py").write_text(
        "class TrainingPlan:\n    def run(self):\n        from dplora.engine import step\n\n        return step\n"
    )
    graph = module_imports(pkg)
    assert graph["dplora.plan.training"] == {"dplora.engine.step"}
    assert upward_imports(graph) == ["dplora.plan.training -> dplora.engine.step"]
    assert cycles(graph) == [["dplora.engine.step", "dplora.plan.training"]]
    (pkg / "plan" / "training.py").write_text("class TrainingPlan:\n    pass\n")
    graph = module_imports(pkg)
    assert upward_imports(graph) == [] and cycles(graph) == []
