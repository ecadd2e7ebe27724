"""The package layout stays one-way: no import cycle, no import against the stage order (issue 24).

Every module's imports are read with ``ast`` (imports inside functions included) by ``scripts/import_graph.py``.
A module may import its own stage and the stages below it, never one above it. The order (``dplora.stages``, its one
copy), lowest first:

    core (dplora, errors, signals, atomic, surface) → accounting → contract → plan → data → engine → mechanism → run →
    release → ledger → evaluate → recipe → audit, synth, export, tuning → cli (and ``python -m dplora``)

Issue 44: only ``dplora/mechanism/`` samples, clips, draws noise or reduces across ranks. The rule names the
forbidden calls (issue 49), so that legitimate collectives (``all_gather_object``, ``broadcast_object_list``,
``barrier``) and initialisers (``torch.randn`` for LoRA or a perturbation) outside the package still pass:
:data:`FORBIDDEN_CALLS` lists them, and :func:`forbidden_calls` finds each call by name or attribute with ``ast``
(both in tests/support/import_rules.py).

The checker itself is tested on planted graphs and on a planted upward import in a temporary package, so the
test on the real tree cannot pass by checking nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import dplora.stages as stage_order
from dplora.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import import_graph  # noqa: E402
from import_graph import cycles, module_imports  # noqa: E402
from support.import_rules import forbidden_calls  # noqa: E402


def stage_of(module: str, stages=STAGES) -> int:
    """Index in ``stages`` of the longest dotted prefix of ``module`` (``dplora.stages.stage_of``); KeyError when no
    stage names it (every module must have one)."""
    rank = stage_order.stage_of(module, stages)
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


def test_only_the_mechanism_samples_clips_draws_noise_or_reduces():
    assert forbidden_calls(ROOT / "dplora") == []


PLANTED = {
    "noise draw": (
        "import torch\n\ndef step(g, sigma, c):\n    return g + torch.normal(0.0, sigma * c, g.shape)\n",
        "noise torch.normal",
    ),
    "CSPRNG draw": (
        "from dplora.mechanism.noise import CsprngGaussian\n\ndef noise(p):\n"
        "    return CsprngGaussian().normal(p, 1.0)\n",
        "noise CsprngGaussian",
    ),
    "sampler": (
        "from dplora.mechanism.sampling import PoissonUnitSampler\n\ndef batch(n, q):\n"
        "    return PoissonUnitSampler(n, q).sample()\n",
        "sampling PoissonUnitSampler",
    ),
    "bernoulli sampler": (
        "import torch\n\ndef batch(n, q):\n    return torch.bernoulli(torch.full((n,), q))\n",
        "sampling bernoulli",
    ),
    "all_reduce": (
        "import torch.distributed as dist\n\ndef reduce(t):\n    dist.all_reduce(t)\n",
        "reduction all_reduce",
    ),
}


@pytest.mark.parametrize("what", sorted(PLANTED))
def test_rule_fails_on_a_planted_call_outside_the_mechanism(tmp_path, what):
    """A noise draw, a sampler or an all_reduce planted in ``dplora/run``: found; the same file inside
    ``dplora/mechanism``: allowed; legitimate collectives and initialisers elsewhere: allowed."""
    source, expected = PLANTED[what]
    pkg = tmp_path / "dplora"
    for sub in ("run", "mechanism", "engine"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "ok.py").write_text(
        "import torch\nimport torch.distributed as dist\n\n"
        "def agree(obj, n):\n    out = [None] * n\n    dist.all_gather_object(out, obj)\n"
        "    dist.broadcast_object_list(out)\n    dist.barrier()\n    return torch.randn(3), out\n"
    )
    (pkg / "mechanism" / "planted.py").write_text(source)
    assert forbidden_calls(pkg) == []
    (pkg / "run" / "planted.py").write_text(source)
    found = forbidden_calls(pkg)
    assert len(found) == 1 and found[0].startswith("dplora.run.planted:") and found[0].endswith(expected), found


# Issue 44 item 4: the stages that run after planning take the plan, the mechanism and the contract's sections
# (DataSection, PrivacySection, TrainingSection, ...), never the whole Contract. What may still take it: the
# contract and plan stages, the CLI, the recipe that plans and assembles a run (its record and checkpoint state
# the contract's digest and YAML), the release record (it states the contract), and the after-release tools that
# run a training or a model of their own (audit, tuning).
CONTRACT_FREE = (
    "dplora.accounting",
    "dplora.ledger",
    "dplora.data",
    "dplora.engine",
    "dplora.mechanism",
    "dplora.run",
    "dplora.evaluate",
    "dplora.synth",
    "dplora.export",
)


def _contract_free_offenders(root: Path) -> list[str]:
    found = import_graph.metrics(root)["contract_functions"]["functions"]
    return [f for f in found if f.startswith(tuple(p + "." for p in CONTRACT_FREE))]


def test_no_stage_after_planning_takes_the_whole_contract():
    assert _contract_free_offenders(ROOT / "dplora") == []


def test_the_contract_rule_finds_a_planted_function(tmp_path):
    pkg = tmp_path / "dplora"
    (pkg / "data").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "data" / "__init__.py"):
        init.write_text("")
    (pkg / "data" / "reader.py").write_text("def rows(path, *, data):\n    return data.path\n")
    assert _contract_free_offenders(pkg) == []
    (pkg / "data" / "reader.py").write_text(
        "from dplora.contract.spec import Contract\n\n\ndef rows(path, spec: Contract):\n    return spec.data.path\n"
    )
    assert _contract_free_offenders(pkg) == ["dplora.data.reader.rows"]
