"""Measure dplora's internal import graph and the layout metrics of issue 44.

Reads every ``dplora/**/*.py`` with ``ast`` (imports inside functions included, ``TYPE_CHECKING`` blocks too) and
prints the number of modules, the import edges between dplora modules, the depth of the longest acyclic import
chain and the import cycles (strongly connected components with more than one module, or a self-import); then
(issue 44) modules and lines per package, modules over 450 lines, functions over 60 lines in ``recipe/``,
functions taking a ``Contract``, edges that exist only inside functions, underscore names crossing modules,
re-exports, edges against the stage order (:data:`dplora.stages.STAGES`) and the parameter count of
``recipe.train.run_training``. :func:`metrics` defines each measure.

Usage: ``python scripts/import_graph.py [PACKAGE_DIR] [--json]`` (default: ``dplora`` beside this script's
parent; ``--json``: every measure as one JSON object). ``tests/test_import_order.py`` reuses
:func:`module_imports` and :func:`cycles`.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

from dplora.stages import STAGES, stage_of, upward_edges  # noqa: F401  (the one copy of the stage order; re-exported)


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


def _parse_all(root: Path) -> dict[str, tuple[Path, ast.Module]]:
    """Each module under ``root`` (resolved) by dotted name, with its file and its ``ast`` tree."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        out[module_name(path, root)] = (path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return out


def _walk_scoped(tree: ast.AST):
    """Every node of ``tree`` with ``True`` when it lies inside a ``def`` (or ``async def``, or lambda)."""
    todo = [(tree, False)]
    while todo:
        node, inside = todo.pop()
        yield node, inside
        deeper = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        todo.extend((child, deeper) for child in ast.iter_child_nodes(node))


def _longest_module(dotted: str, names) -> str:
    while dotted and dotted not in names:
        dotted = dotted.rpartition(".")[0]
    return dotted


def import_sites(root: Path) -> list[tuple[str, str, bool]]:
    """Every import of a module of the package: ``(importer, imported, inside_def)``, one row per import statement
    and target (a module importing itself is left out). Resolution as in :func:`module_imports`."""
    root = root.resolve()
    parsed = _parse_all(root)
    top = root.name
    rows = []
    for name, (path, tree) in parsed.items():
        is_package = path.name == "__init__.py"
        for node, inside in _walk_scoped(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [_longest_module(alias.name, parsed) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, name, is_package)
                if base != top and not base.startswith(top + "."):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in parsed else _longest_module(base, parsed))
            rows.extend((name, t, inside) for t in targets if t and t != name)
    return rows


def module_imports(root: Path) -> dict[str, set[str]]:
    """Map each module under ``root`` to the set of modules of the same package it imports.

    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``. Importing
    a submodule also runs its parent packages' ``__init__``, but those are not counted as edges (they hold only
    docstrings and re-exports here).
    """
    root = root.resolve()
    graph: dict[str, set[str]] = {module_name(f, root): set() for f in sorted(root.rglob("*.py"))}
    for src, dst, _inside in import_sites(root):
        graph[src].add(dst)
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


BIG_MODULE_LINES = 450
LONG_FUNCTION_LINES = 60


def _functions(tree: ast.Module):
    """Every ``def`` of ``tree`` (methods and nested ones too) as ``(qualified name, node)``, in source order."""
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + child.name, child))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _all_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs, *([a.kwarg] if a.kwarg else [])]


def _takes_contract(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for arg in _all_params(fn):
        if arg.arg == "contract":
            return True
        if arg.annotation is not None and re.search(r"\bContract\b", ast.unparse(arg.annotation)):
            return True
    return False


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` → ``["a", "b", "c"]``; ``None`` for anything that is not a chain of names."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _noqa_f401(lines: list[str], node: ast.stmt) -> bool:
    return any(re.search(r"#\s*noqa\b.*F401", line) for line in lines[node.lineno - 1 : node.end_lineno])


def _dunder_all(tree: ast.Module) -> set[str]:
    """The string names in a module-level ``__all__ = [...]`` / ``(...)`` / ``+= [...]``."""
    names: set[str] = set()
    for node in tree.body:
        value = None
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            value = node.value
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and getattr(node.target, "id", None) == "__all__":
            value = node.value
        if isinstance(value, (ast.List, ast.Tuple)):
            names.update(e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return names


def metrics(root: Path) -> dict:
    """All the measures of issue 44 for the package folder ``root``, as one JSON-ready mapping.

    Keys: ``modules``, ``edges`` (import edges between the package's modules), ``depth`` (modules on the longest
    acyclic chain), ``longest_chain``, ``cycles``; ``packages`` (per sub-package folder, ``(root)`` for the top
    level files: ``modules`` = .py files, ``lines`` = text lines); ``big_modules`` (over 450 lines);
    ``long_recipe_functions`` (a ``def`` in ``<root>/recipe/`` spanning over 60 lines, ``def`` line to last line,
    decorators left out); ``contract_functions`` (a ``def`` with a parameter named ``contract`` or annotated with a
    type expression naming ``Contract``); ``inside_function_edges`` (edges whose every import statement lies inside
    a ``def``) out of ``edges``; ``underscore_names`` (``from <pkg>.x import _name`` or ``m._name`` on a bound
    package module, dunders excepted, in another module than the one that defines it; unique per importer, module
    and name), split by whether both modules are in the same sub-package; ``reexports`` (a name imported from a
    package module and listed in ``__all__``, or on an import marked ``# noqa: F401``, or imported at module level
    by a package ``__init__`` that does not use it itself; unique per module and name); ``init_imports`` (package
    ``__init__`` modules importing package names at module level, and how many names); ``upward_edges`` (against
    :data:`STAGES`);
    ``run_training_parameters`` (every named parameter of ``<root>.recipe.train.run_training``, ``*args`` and
    ``**kwargs`` one each; ``None`` when there is no such function). Raises ``SyntaxError`` on an unparsable file.
    """
    root = root.resolve()
    top = root.name
    parsed = _parse_all(root)
    # sub-package folder of each module ("(root)" for the files beside the top __init__)
    folder = {
        n: (p.relative_to(root).parts[0] if len(p.relative_to(root).parts) > 1 else "(root)")
        for n, (p, _t) in parsed.items()
    }
    graph = module_imports(root)
    sites = import_sites(root)
    found = cycles(graph)
    texts = {n: p.read_text(encoding="utf-8") for n, (p, _t) in parsed.items()}

    packages: dict[str, dict[str, int]] = {}
    for name in parsed:
        row = packages.setdefault(folder[name], {"modules": 0, "lines": 0})
        row["modules"] += 1
        row["lines"] += len(texts[name].splitlines())
    big = sorted(
        (
            {"module": n, "lines": len(t.splitlines())}
            for n, t in texts.items()
            if len(t.splitlines()) > BIG_MODULE_LINES
        ),
        key=lambda r: (-r["lines"], r["module"]),
    )

    long_fns, contract_fns = [], []
    per_pkg: dict[str, int] = {}
    recipe = f"{top}.recipe"
    for name, (_path, tree) in parsed.items():
        for qual, fn in _functions(tree):
            if name == recipe or name.startswith(recipe + "."):
                span = fn.end_lineno - fn.lineno + 1
                if span > LONG_FUNCTION_LINES:
                    long_fns.append({"function": f"{name}.{qual}", "lines": span})
            if _takes_contract(fn):
                contract_fns.append(f"{name}.{qual}")
                per_pkg[folder[name]] = per_pkg.get(folder[name], 0) + 1
    long_fns.sort(key=lambda r: (-r["lines"], r["function"]))

    outside: dict[tuple[str, str], bool] = {}
    for src, dst, inside in sites:
        outside[(src, dst)] = outside.get((src, dst), False) or not inside
    inside_only = sorted(f"{s} -> {d}" for (s, d), out in outside.items() if not out)

    underscore: set[tuple[str, str, str]] = set()
    reexports: set[tuple[str, str, str]] = set()
    init_imports: set[tuple[str, str, str]] = set()
    for name, (path, tree) in parsed.items():
        is_package = path.name == "__init__.py"
        lines = texts[name].splitlines()
        exported = _dunder_all(tree)
        bound: dict[str, str] = {}  # local name -> package module it stands for
        # an __init__'s own use of a name it imports is no re-export (unless __all__ or a noqa says so)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} if is_package else set()
        for node, inside in _walk_scoped(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == top or alias.name.startswith(top + "."):
                        if alias.asname:
                            if alias.name in parsed:
                                bound[alias.asname] = alias.name
                        else:
                            bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, name, is_package)
                if base != top and not base.startswith(top + "."):
                    continue
                marked = _noqa_f401(lines, node)
                for alias in node.names:
                    local = alias.asname or alias.name
                    sub = f"{base}.{alias.name}"
                    if sub in parsed:
                        bound[local] = sub
                    source = sub if sub in parsed else _longest_module(base, parsed) or base
                    if _private(alias.name) and source != name:
                        underscore.add((name, base, alias.name))
                    if is_package and not inside:
                        init_imports.add((name, base, local))
                    unused_in_init = is_package and not inside and local not in used
                    if alias.name != "*" and (local in exported or marked or unused_in_init):
                        reexports.add((name, base, local))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                parts = _dotted(node.value)
                if not parts or parts[0] not in bound:
                    continue
                dotted = ".".join([bound[parts[0]], *parts[1:]])
                if dotted in parsed and dotted != name:
                    underscore.add((name, dotted, node.attr))
    same_pkg = [u for u in underscore if folder[u[0]] == folder.get(_longest_module(u[1], parsed), "?")]

    params = None
    train = parsed.get(f"{top}.recipe.train")
    if train is not None:
        for node in train[1].body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "run_training":
                params = len(_all_params(node))
    up = upward_edges(graph)
    return {
        "modules": len(graph),
        "edges": sum(len(v) for v in graph.values()),
        "depth": depth(graph),
        "longest_chain": longest_chain(graph),
        "cycles": found,
        "packages": dict(sorted(packages.items())),
        "big_modules": big,
        "long_recipe_functions": long_fns,
        "contract_functions": {
            "count": len(contract_fns),
            "per_package": dict(sorted(per_pkg.items())),
            "functions": sorted(contract_fns),
        },
        "inside_function_edges": {
            "count": len(inside_only),
            "of": sum(len(v) for v in graph.values()),
            "edges": inside_only,
        },
        "underscore_names": {
            "count": len(underscore),
            "distinct": len({(b, c) for _a, b, c in underscore}),
            "same_package": len(same_pkg),
            "cross_package": len(underscore) - len(same_pkg),
            "names": [f"{a}: {b}.{c}" for a, b, c in sorted(underscore)],
        },
        "reexports": {"count": len(reexports), "names": [f"{a}: {c} (from {b})" for a, b, c in sorted(reexports)]},
        "init_imports": {
            "count": len({a for a, _b, _c in init_imports}),
            "names": len(init_imports),
            "modules": sorted({a for a, _b, _c in init_imports}),
        },
        "upward_edges": {"count": len(up), "edges": up},
        "run_training_parameters": params,
    }


def report(m: dict) -> list[str]:
    """The text lines printed for the mapping of :func:`metrics` (the first lines as before issue 44)."""
    out = [
        f"modules: {m['modules']}",
        f"edges: {m['edges']}",
        f"depth: {m['depth']} modules ({m['depth'] - 1} import edges)",
    ]
    if m["longest_chain"]:
        out.append("  " + " -> ".join(m["longest_chain"]))
    out.append(f"cycles: {len(m['cycles'])}")
    out += ["  " + " <-> ".join(comp) for comp in m["cycles"]]
    out.append("packages (modules, lines):")
    out += [f"  {p}: {r['modules']}, {r['lines']}" for p, r in m["packages"].items()]
    out.append(f"modules over {BIG_MODULE_LINES} lines: {len(m['big_modules'])}")
    out += [f"  {r['module']}: {r['lines']}" for r in m["big_modules"]]
    out.append(f"recipe functions over {LONG_FUNCTION_LINES} lines: {len(m['long_recipe_functions'])}")
    out += [f"  {r['function']}: {r['lines']}" for r in m["long_recipe_functions"]]
    c = m["contract_functions"]
    per = ", ".join(f"{p} {n}" for p, n in c["per_package"].items())
    out.append(f"functions taking a Contract: {c['count']}" + (f" ({per})" if per else ""))
    e = m["inside_function_edges"]
    out.append(f"edges only inside functions: {e['count']} of {e['of']}")
    u = m["underscore_names"]
    out.append(
        f"underscore names crossing modules: {u['count']} ({u['distinct']} distinct names; "
        f"{u['same_package']} inside a package, {u['cross_package']} across packages)"
    )
    out += [f"  {n}" for n in u["names"]]
    r = m["reexports"]
    out.append(f"re-exports: {r['count']}")
    out += [f"  {n}" for n in r["names"]]
    i = m["init_imports"]
    out.append(f"package __init__s importing package names: {i['count']} ({i['names']} names)")
    out += [f"  {n}" for n in i["modules"]]
    up = m["upward_edges"]
    out.append(f"upward edges: {up['count']}")
    out += [f"  {n}" for n in up["edges"]]
    p = m["run_training_parameters"]
    out.append(f"run_training parameters: {'not found' if p is None else p}")
    return out


def main(argv: list[str]) -> int:
    args = [a for a in argv[1:] if a != "--json"]
    root = Path(args[0]) if args else Path(__file__).resolve().parents[1] / "dplora"
    m = metrics(root)
    if "--json" in argv[1:]:
        print(json.dumps(m, indent=1))
    else:
        print("\n".join(report(m)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
