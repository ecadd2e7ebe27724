"""Measure dplora's internal import graph: modules, edges, longest chain, cycles.

Reads every ``dplora/**/*.py`` with ``ast`` (imports inside functions included, ``TYPE_CHECKING`` blocks too) and
prints the number of modules, the import edges between dplora modules, the depth of the longest acyclic import
chain and the import cycles (strongly connected components with more than one module, or a self-import).

Usage: ``python scripts/import_graph.py [PACKAGE_DIR]`` (default: ``dplora`` beside this script's parent).
``tests/test_import_order.py`` reuses :func:`module_imports` and :func:`cycles`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    """Dotted name of ``path`` under the package folder ``root`` (``dplora/run/loop.py`` → ``dplora.run.loop``)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def module_imports(root: Path) -> dict[str, set[str]]:
    """Map each module under ``root`` to the set of modules of the same package it imports.

    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``. Importing
    a submodule also runs its parent packages' ``__init__``, but those are not counted as edges (they hold only
    docstrings and re-exports here).
    """
    root = root.resolve()
    files = sorted(root.rglob("*.py"))
    names = {module_name(f, root): f for f in files}
    top = root.name
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    mod = alias.name
                    while mod and mod not in names:
                        mod = mod.rpartition(".")[0]
                    if mod:
                        targets.add(mod)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, name, is_package)
                if base != top and not base.startswith(top + "."):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in names:
                        targets.add(sub)
                    else:
                        mod = base
                        while mod and mod not in names:
                            mod = mod.rpartition(".")[0]
                        if mod:
                            targets.add(mod)
        targets.discard(name)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan 1972), each sorted; sorted by first name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def depth(graph: dict[str, set[str]]) -> int:
    """Longest import chain, counted in modules, over the condensation (each cycle counts as one module)."""
    comp_of: dict[str, str] = {}
    for comp in cycles(graph):
        for m in comp:
            comp_of[m] = comp[0]
    cgraph: dict[str, set[str]] = {}
    for v, ws in graph.items():
        cv = comp_of.get(v, v)
        cgraph.setdefault(cv, set()).update(comp_of.get(w, w) for w in ws if comp_of.get(w, w) != cv)
    memo: dict[str, int] = {}

    def longest(v: str) -> int:
        if v not in memo:
            memo[v] = 1 + max((longest(w) for w in cgraph.get(v, ())), default=0)
        return memo[v]

    return max((longest(v) for v in cgraph), default=0)


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """One longest import chain (importer first), for an acyclic graph; ``[]`` when the graph has a cycle."""
    if cycles(graph):
        return []
    memo: dict[str, list[str]] = {}

    def chain(v: str) -> list[str]:
        if v not in memo:
            memo[v] = [v, *max((chain(w) for w in sorted(graph.get(v, ()))), key=len, default=[])]
        return memo[v]

    return max((chain(v) for v in sorted(graph)), key=len, default=[])


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / "dplora"
    graph = module_imports(root)
    found = cycles(graph)
    print(f"modules: {len(graph)}")
    print(f"edges: {sum(len(v) for v in graph.values())}")
    print(f"depth: {depth(graph)} modules ({depth(graph) - 1} import edges)")
    if chain := longest_chain(graph):
        print("  " + " -> ".join(chain))
    print(f"cycles: {len(found)}")
    for comp in found:
        print("  " + " <-> ".join(comp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
