"""The mechanism rule: only ``dplora.mechanism`` samples, clips, draws noise or reduces across ranks.

Shared by tests/test_import_order.py (the rule on the real tree) and tests/mechanism/test_mechanism_rule_attacks.py
(planted calls). The rule names the forbidden calls, so that legitimate collectives (``all_gather_object``,
``broadcast_object_list``, ``barrier``) and initialisers (``torch.randn`` for LoRA or a perturbation) outside the
package still pass: :data:`FORBIDDEN_CALLS` lists them, and :func:`forbidden_calls` finds each call by name or
attribute with ``ast``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

# The calls that make the DP mechanism, by what they do; a call whose function name (or attribute) is one of these
# is allowed only inside dplora.mechanism.
# rng.normal legitimately elsewhere? no: it is not matched, being another attribute owner).
FORBIDDEN_CALLS: dict[str, tuple[str, ...]] = {
    "noise": (
        "CsprngGaussian", "chacha20_keystream", "box_muller_pair_sums_fp64", "privatize", "ChaCha20",
        "chacha20_words64", "chacha20_blocks", "chacha20_keystream_torch",  # the device keystream
        "randn_like", "normal_",  # the usual ways to add Gaussian noise to a gradient in torch
    ),
    "sampling": ("PoissonUnitSampler", "ShardedPoissonSampler", "bernoulli", "binomial"),
    "clipping": ("UnitClipAccumulator", "clip_grad_norm_", "DPOptimizer"),
    "reduction": (
        "all_reduce", "all_reduce_coalesced", "reduce_scatter", "reduce_scatter_tensor", "StepReducer",
        "all_gather", "all_gather_into_tensor",  # a gathered tensor summed is a reduction (all_gather_object passes)
    ),
}  # fmt: skip
# forbidden only when called on these modules (a Gaussian draw, a reduce to one rank), not on any object
MODULE_ONLY = {"normal": ("torch",), "reduce": ("torch.distributed",)}
MECHANISM = "dplora.mechanism"


def aliases(tree) -> tuple[dict[str, str], dict[str, str]]:
    """(local name → imported name for ``from m import n as a``, local name → module for ``import m as a``)."""
    names, modules = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                names[a.asname or a.name] = a.name
                if node.module:
                    modules.setdefault(a.asname or a.name, f"{node.module}.{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    return names, modules


def forbidden_calls(root: Path) -> list[str]:
    """Every call of :data:`FORBIDDEN_CALLS` (and of :data:`MODULE_ONLY` on its modules) outside
    ``dplora.mechanism``, as ``module:line kind name``, sorted; names imported under another name are resolved
    (``from torch.distributed import all_reduce as ar``; ``import torch as th``)."""
    from import_graph import module_name

    kinds = {n: kind for kind, ns in FORBIDDEN_CALLS.items() for n in ns}
    found = []
    root = root.resolve()
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        if module == MECHANISM or module.startswith(MECHANISM + "."):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names, modules = aliases(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func, owner = node.func, None
            if isinstance(func, ast.Name):
                name = names.get(func.id, func.id)
            elif isinstance(func, ast.Attribute):
                name = func.attr
                if isinstance(func.value, ast.Name):
                    owner = modules.get(func.value.id, func.value.id)
            else:
                continue
            if name in kinds:
                found.append(f"{module}:{node.lineno} {kinds[name]} {name}")
            elif name in MODULE_ONLY and owner in MODULE_ONLY[name]:
                kind = "noise" if name == "normal" else "reduction"
                found.append(f"{module}:{node.lineno} {kind} {owner}.{name}")
    return sorted(found)
