"""How far the contract travels: a static walk (``ast`` only, nothing imported) from the ``train`` command.

A stop is a package function that receives the contract or one of its sections, directly or in a carrier. The walk
is approximate but deterministic (modules in sorted order, one FIFO worklist):

- Start: the function registered as the typer command ``train`` (``@app.command()`` on a def or
  ``app.command(...)(module.func)``; the first string argument or ``name=``, else the function's name with ``_`` as
  ``-``). It is a stop. The contract is made there, not received: the command's own module is searched from it
  without tracked arguments, and its functions that hold a tracked local are stops too.
- Tracked types: ``Contract`` (the first class so named), the classes its fields are annotated with (the sections),
  and carriers: package classes with a field of a tracked type, by class-level annotation (dataclass, pydantic) or
  by ``self.x = <tracked value>`` in a visited method.
- In a visited function a name is tracked when it is a parameter annotated with a tracked type (``X | None``,
  ``Optional[X]``, strings too), a parameter bound at a call site, ``self`` of a tracked class, or a local assigned
  anywhere in the body (flow-insensitive, never untracked again) from a tracked expression: a tracked name; a tracked
  field (``contract.privacy``, ``spec.contract``, not ``contract.training.seed``); ``a if c else b``, ``a or b``; a
  tuple or dict literal holding one; a call to a tracked class, or to a function whose return annotation is tracked
  or whose ``return`` gave a tracked value when visited (tuples unpacked element by element);
  ``dataclasses.replace(x, ...)`` or ``x.model_copy(...)`` of a tracked ``x``.
- A call with a tracked argument (positional, keyword, ``**`` of a dict literal's string keys, or the receiver of a
  method call) makes its callee a stop, visited with those parameters bound. A tuple or dict counts only unpacked or
  spread; a tracked value after a ``*args`` spread makes a stop but binds nothing.
- Calls resolve through ``import x``, ``import x as y``, ``from x import y`` (module level or in the function;
  re-exports followed), ``module.func``, ``Class.method``, ``self.method`` and methods of tracked receivers (package
  base classes searched). A class call stops at its own ``__init__`` only (a generated one is none). Not followed:
  properties, lambdas, callbacks passed as values, calls on untracked objects. Nested defs are read as part of the
  function that defines them.
- Facts learned while walking (fields from ``self.x = ...``, inferred return types) restart the walk until stable.

Usage: ``python scripts/contract_walk.py [PACKAGE_DIR] [--list] [--json]`` (default: ``dplora`` beside ``scripts``).
"""

from __future__ import annotations

import ast
import json
import sys
from collections import deque
from pathlib import Path

COMMAND = "train"
FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _shallow(nodes):
    """Every node under ``nodes`` without entering a def, class or lambda (the defs themselves included)."""
    todo = deque(nodes)
    while todo:
        node = todo.popleft()
        yield node
        if not isinstance(node, (*FUNCS, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def _command_name(node, default: str | None) -> str | None:
    """The typer command name of ``X.command(...)``; None for any other node."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "command"):
        return None
    named = [k.value for k in node.keywords if k.arg == "name"] + node.args[:1]
    if named and isinstance(named[0], ast.Constant) and isinstance(named[0].value, str):
        return named[0].value
    return default.replace("_", "-") if default else None


def _copy_of(call: ast.Call):
    """``x`` of ``x.model_copy(...)``, ``replace(x, ...)`` or ``dataclasses.replace(x, ...)`` (same type), or None."""
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == "model_copy":
        return f.value
    dataclasses_replace = isinstance(f, ast.Attribute) and getattr(f.value, "id", None) == "dataclasses"
    replace = getattr(f, "id", None) == "replace" or (dataclasses_replace and f.attr == "replace")
    return call.args[0] if replace and call.args else None


class Walk:
    """Modules, names, classes and, after :meth:`run`, the stops. Functions and classes are ``"module:qualname"``;
    a type is a class key, or a tuple or a dict of types (None where untracked)."""

    def __init__(self, root: Path):
        self.trees, self.packages, self.defs, self.names = {}, set(), {}, {}
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
                self.packages.add(".".join(parts))
            self.trees[".".join(parts)] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for mod, tree in self.trees.items():
            self.names[mod] = {}
            for node in _shallow(tree.body):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    self.names[mod].update(self._imports(node, mod))
                elif isinstance(node, (*FUNCS, ast.ClassDef)):
                    self.defs[f"{mod}:{node.name}"] = node
                    methods = [s for s in node.body if isinstance(s, FUNCS)] if isinstance(node, ast.ClassDef) else []
                    self.defs.update({f"{mod}:{node.name}.{s.name}": s for s in methods})
        classes = [k for k, n in self.defs.items() if isinstance(n, ast.ClassDef)]
        self.bases = {k: [self._class(self._resolve(b, self._ctx(k))) for b in self.defs[k].bases] for k in classes}
        contract = next((k for k in classes if k.endswith(":Contract")), None)
        if contract is None:
            raise SystemExit(f"no class Contract under {root}")
        self.fields, self.returns, self.roots, grew = {k: {} for k in classes}, {}, {contract}, True
        while grew:  # sections first (any class a contract field names), then carriers, which may hold carriers
            grew = False
            for k in classes:
                for s in self.defs[k].body:
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                        t = self._ann(s.annotation, self._ctx(k))
                        t = t if k == contract else self._keep(t)
                        if isinstance(t, str) and s.target.id not in self.fields[k]:
                            self.fields[k][s.target.id], grew = t, True
                            self.roots |= {t} if k == contract else set()

    def _imports(self, node, mod: str) -> dict:
        if isinstance(node, ast.Import):
            top = {a.name: a.name.split(".")[0] for a in node.names}  # `import a.b` binds `a`
            return {a.asname or top[a.name]: ("mod", a.name if a.asname else top[a.name]) for a in node.names}
        base = mod.split(".") if mod in self.packages else mod.split(".")[:-1]
        base = base[: len(base) - node.level + 1] if node.level else []
        return {
            a.asname or a.name: ("sym", ".".join(base + [node.module or ""]).strip("."), a.name) for a in node.names
        }

    def _sym(self, b):
        """``("mod", m)`` or ``("def", key)`` for an import binding, re-exports followed; None outside the package."""
        for _ in range(20):
            if not b or b[0] != "sym":
                break
            if f"{b[1]}:{b[2]}" in self.defs:
                return ("def", f"{b[1]}:{b[2]}")
            b = ("mod", f"{b[1]}.{b[2]}") if f"{b[1]}.{b[2]}" in self.trees else self.names.get(b[1], {}).get(b[2])
        return b if b and b[0] == "mod" and b[1] in self.trees else None

    def _ctx(self, key: str, local: dict | None = None, self_name: str | None = None) -> dict:
        mod, qual = key.split(":")
        cls = f"{mod}:{qual.split('.')[0]}" if "." in qual else None
        return {"mod": mod, "local": local or {}, "cls": cls, "self": self_name}

    def _resolve(self, node, ctx):
        if isinstance(node, ast.Name):
            if f"{ctx['mod']}:{node.id}" in self.defs and node.id not in ctx["local"]:
                return ("def", f"{ctx['mod']}:{node.id}")
            return self._sym(ctx["local"].get(node.id) or self.names[ctx["mod"]].get(node.id))
        base = self._resolve(node.value, ctx) if isinstance(node, ast.Attribute) else None
        if base and base[0] == "mod":
            return self._sym(("sym", base[1], node.attr))
        method = self._method(base[1], node.attr) if self._class(base) else None
        return ("def", method) if method else None

    def _class(self, resolved) -> str | None:
        ok = resolved and resolved[0] == "def" and isinstance(self.defs[resolved[1]], ast.ClassDef)
        return resolved[1] if ok else None

    def _mro(self, cls: str) -> list[str]:
        order, todo = [], [cls]
        while todo:
            if (c := todo.pop(0)) and c not in order:
                order.append(c)
                todo += self.bases.get(c, [])
        return order

    def _method(self, cls: str, name: str) -> str | None:
        return next((f"{c}.{name}" for c in self._mro(cls) if f"{c}.{name}" in self.defs), None)

    def _keep(self, t):
        if isinstance(t, tuple):
            kept = tuple(self._keep(e) for e in t)
            return kept if any(kept) else None
        return t if t and any(c in self.roots or self.fields.get(c) for c in self._mro(t)) else None

    def _ann(self, node, ctx):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                return self._ann(ast.parse(node.value, mode="eval").body, ctx)
            except SyntaxError:
                return None
        if isinstance(node, ast.BinOp):
            return self._ann(node.left, ctx) or self._ann(node.right, ctx)
        if isinstance(node, ast.Subscript):
            head = getattr(node.value, "id", getattr(node.value, "attr", ""))
            elts = [self._ann(e, ctx) for e in (node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice])]
            if head in ("tuple", "Tuple"):
                return tuple(elts)
            return next(filter(None, elts), None) if head in ("Optional", "Union") else None
        return self._class(self._resolve(node, ctx)) if node is not None else None

    def _type(self, node, env: dict, ctx):
        if isinstance(node, ast.Name):
            return env.get(node.id)
        if isinstance(node, ast.Attribute) and isinstance(t := self._type(node.value, env, ctx), str):
            return next((self.fields[c][node.attr] for c in self._mro(t) if node.attr in self.fields.get(c, {})), None)
        if isinstance(node, (ast.IfExp, ast.BoolOp)):
            parts = [node.body, node.orelse] if isinstance(node, ast.IfExp) else node.values
            return next(filter(None, (self._type(p, env, ctx) for p in parts)), None)
        if isinstance(node, ast.Tuple):
            types = tuple(self._type(e, env, ctx) for e in node.elts)
            return types if any(types) else None
        if isinstance(node, ast.Dict):  # keyword arguments gathered for a later ``**``
            keys = [getattr(k, "value", None) for k in node.keys]
            pairs = zip(keys, node.values, strict=True)
            return {k: t for k, v in pairs if isinstance(k, str) and (t := self._type(v, env, ctx))} or None
        if not isinstance(node, ast.Call):
            return None
        if (copied := _copy_of(node)) is not None:
            return self._type(copied, env, ctx)
        if cls := self._class(self._resolve(node.func, ctx)):
            return self._keep(cls)
        if target := self._target(node.func, env, ctx)[0]:
            return self._keep(self._ann(self.defs[target].returns, self._ctx(target))) or self.returns.get(target)
        return None

    def _target(self, f, env: dict, ctx):
        """(function key, tracked receiver type, parameters the call skips) of the callee ``f``, or Nones."""
        resolved = self._resolve(f, ctx)
        if self._class(resolved):
            return self._method(resolved[1], "__init__"), None, 1
        if resolved:
            return (resolved[1] if resolved[0] == "def" else None), None, 0
        if isinstance(f, ast.Attribute) and isinstance(t := self._type(f.value, env, ctx), str):
            return self._method(t, f.attr), t, 1
        if isinstance(f, ast.Attribute) and ctx["cls"] and getattr(f.value, "id", None) == ctx["self"]:
            return self._method(ctx["cls"], f.attr), None, 1
        return None, None, 0

    def entry(self) -> str:
        for mod, tree in self.trees.items():
            for node in ast.walk(tree):
                if isinstance(node, FUNCS) and f"{mod}:{node.name}" in self.defs:
                    if any(_command_name(d, node.name) == COMMAND for d in node.decorator_list):
                        return f"{mod}:{node.name}"
                if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Call):
                    resolved = self._resolve(node.args[0], self._ctx(f"{mod}:"))
                    name = _command_name(node.func, getattr(node.args[0], "attr", getattr(node.args[0], "id", None)))
                    if name == COMMAND and resolved and resolved[0] == "def":
                        return resolved[1]
        raise SystemExit(f"no typer command named {COMMAND!r}")

    def run(self) -> str:
        start = self.entry()
        for _ in range(50):  # learned facts only grow; each restart sees all of them from the start
            before = ({k: dict(v) for k, v in self.fields.items()}, dict(self.returns))
            self.stops, self.bound, queue = {start}, {start: {}}, deque([start])
            while queue:
                self._visit(queue.popleft(), start.split(":")[0], queue)
            if before == (self.fields, self.returns):
                break
        return start

    def _visit(self, key: str, home: str, queue: deque) -> None:
        fn, mod = self.defs[key], key.split(":")[0]
        params, nodes, local = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs], list(ast.walk(fn)), {}
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                local.update(self._imports(node, mod))
        ctx = self._ctx(key, local, params[0].arg if params and "." in key.split(":")[1] else None)
        env = {a.arg: t for a in params if (t := self._keep(self._ann(a.annotation, ctx)))}
        if ctx["self"] and self._keep(ctx["cls"]):
            env[ctx["self"]] = ctx["cls"]
        env.update(self.bound[key])
        pairs = [(t, n.value) for n in nodes if isinstance(n, ast.Assign) for t in n.targets]
        pairs += [(n.target, n.value) for n in nodes if isinstance(n, (ast.AnnAssign, ast.NamedExpr)) and n.value]
        while any([self._assign(t, self._type(v, env, ctx), env, ctx) for t, v in pairs]):
            pass  # to a fixed point: a local's type may come from a later line (a loop)
        if env and mod == home:
            self.stops.add(key)
        for node in _shallow(fn.body):
            if isinstance(node, ast.Return) and (t := self._type(node.value, env, ctx)) and key not in self.returns:
                self.returns[key] = t
        for node in nodes:
            if isinstance(node, ast.Call):
                self._call(node, env, ctx, mod == home, queue)

    def _assign(self, target, t, env: dict, ctx) -> bool:
        if t is None:
            return False
        if isinstance(target, ast.Name) and target.id not in env:
            env[target.id] = t
            return True
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(t, tuple):
            names = target.elts[: next((i for i, e in enumerate(target.elts) if isinstance(e, ast.Starred)), None)]
            return any([self._assign(n, e, env, ctx) for n, e in zip(names, t, strict=False)])
        own = isinstance(target, ast.Attribute) and getattr(target.value, "id", None) == ctx["self"] and ctx["cls"]
        if own and isinstance(t, str) and target.attr not in self.fields[ctx["cls"]]:
            self.fields[ctx["cls"]][target.attr] = t  # the class now carries the contract: the walk restarts
            env.setdefault(ctx["self"], ctx["cls"])
            return True
        return False

    def _call(self, node: ast.Call, env: dict, ctx, at_home: bool, queue: deque) -> None:
        target, receiver, skip = self._target(node.func, env, ctx)
        if target is None or not isinstance(fn := self.defs[target], FUNCS):
            return
        positional = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
        bound = {positional[0]: receiver} if receiver and positional else {}
        positional, names, hit = positional[skip:], {a.arg for a in fn.args.kwonlyargs}, bool(receiver)
        starred = False
        for i, arg in enumerate(node.args):
            starred |= isinstance(arg, ast.Starred)
            if isinstance(t := self._type(arg, env, ctx), str):
                hit = True
                bound.update({positional[i]: t} if not starred and i < len(positional) else {})
        for kw in node.keywords:
            t = self._type(kw.value, env, ctx)
            for name, value in (t if kw.arg is None and isinstance(t, dict) else {kw.arg: t}).items():
                if isinstance(value, str):
                    hit = True
                    bound.update({name: value} if name in names or name in positional else {})
        if hit:
            self.stops.add(target)
        elif not (at_home and ctx["mod"] == target.split(":")[0]):
            return  # only the command's own module is searched without the contract in hand
        merged = {**bound, **self.bound.get(target, {})}
        if target not in self.bound or merged != self.bound[target]:
            self.bound[target] = merged
            queue.append(target)


def walk(root: Path) -> dict:
    """The walk from the ``train`` command of the package at ``root``: entry, counts and the stops by module."""
    w = Walk(Path(root))
    start, by_module = w.run(), {}
    for stop in sorted(w.stops):
        by_module.setdefault(stop.split(":")[0], []).append(stop.split(":")[1])
    return {"entry": start.replace(":", "."), "stops": len(w.stops), "modules": len(by_module), "by_module": by_module}


def main(argv: list[str]) -> int:
    flags, paths = {a for a in argv if a.startswith("--")}, [a for a in argv if not a.startswith("--")]
    if flags - {"--json", "--list"} or len(paths) > 1:
        print("usage: contract_walk.py [PACKAGE_DIR] [--list] [--json]", file=sys.stderr)
        return 2
    doc = walk(root := (Path(paths[0]) if paths else Path(__file__).resolve().parents[1] / "dplora").resolve())
    if "--json" in flags:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"contract walk from {root.name} {COMMAND}: {doc['stops']} stops in {doc['modules']} modules")
    for mod, quals in doc["by_module"].items() if "--list" in flags else ():
        print(f"  {mod} ({len(quals)}): {', '.join(quals)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
