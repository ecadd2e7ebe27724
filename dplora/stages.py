"""The package's stage order, lowest first: a module may import its own stage and the stages below it, never one above.

The data flows one way: contract → plan (no model) → data → engine → run → release → after-release (eval, audit, synth,
tuning), with the CLI on top. ``tests/test_import_order.py`` checks every import of the package against this list and
``scripts/import_graph.py`` reports the graph's metrics with it. A module belongs to the stage of its longest matching
dotted prefix (the root package only as itself). Pure data and two pure functions: this module imports nothing.
"""

from __future__ import annotations

STAGES: list[tuple[str, ...]] = [
    ("dplora", "dplora.errors", "dplora.signals", "dplora.atomic", "dplora.surface", "dplora.stages"),
    ("dplora.accounting",),
    ("dplora.contract",),
    ("dplora.plan",),
    ("dplora.data",),
    ("dplora.engine",),
    ("dplora.mechanism",),
    ("dplora.run",),
    ("dplora.release",),
    ("dplora.ledger",),
    ("dplora.evaluate",),
    ("dplora.recipe",),
    ("dplora.audit", "dplora.synth", "dplora.export", "dplora.tuning"),
    ("dplora.api",),
    ("dplora.cli", "dplora.__main__"),
]


def stage_of(module: str, stages: list[tuple[str, ...]] = STAGES) -> int | None:
    """Index in ``stages`` of the longest dotted prefix of the dotted module name ``module``; ``None`` when no stage
    names it. Raises nothing."""
    best, rank = -1, None
    for i, names in enumerate(stages):
        for name in names:
            inside = module == name or (name != "dplora" and module.startswith(name + "."))
            if inside and len(name) > best:
                best, rank = len(name), i
    return rank


def upward_edges(graph: dict[str, set[str]], stages: list[tuple[str, ...]] = STAGES) -> list[str]:
    """Each ``importer -> imported`` edge of ``graph`` (module name → the module names it imports) whose target sits in
    a higher stage than its source, sorted; edges with an end outside every stage are left out. Raises nothing."""
    out = []
    for src, dsts in graph.items():
        for dst in dsts:
            s, d = stage_of(src, stages), stage_of(dst, stages)
            if s is not None and d is not None and d > s:
                out.append(f"{src} -> {dst}")
    return sorted(out)
