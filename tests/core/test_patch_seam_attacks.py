"""Attack A9 on the test seams: no name a test monkeypatches was hoisted into a module-level ``from ... import`` in
dplora (a dead seam: the patch would test nothing)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# names a50d302 moved from function bodies into module-level ``from X import name`` statements
HOISTED_FROM = {
    "dplora.contract.aliases": {"suggest"}, "dplora.contract.shape": {"resolve_auto"},
    "dplora.data.cells": {"tokenize_cells"},
    "dplora.data.chat": {"ChatEncoder", "check_messages", "generation_ids", "template_in_use", "template_sha256",
                         "tokenization_entry"},
    "dplora.data.demo": {"generate_tickets", "write_tickets"}, "dplora.data.digest": {"sha256_file"},
    "dplora.data.twcs": {"write_twcs_conversations", "write_twcs_pairs"},
    "dplora.data.twcs_tweets": {"load_brands"},
    "dplora.engine.lora": {"adapted_module_names", "library_error_line", "library_warnings", "resolve_target_modules"},
    "dplora.engine.schedule": {"make_scheduler", "step_scheduler"}, "dplora.evaluate.plot": {"plot_run"},
    "dplora.evaluate.report": {"report_lines"}, "dplora.export.files": {"export_release"},
    "dplora.plan.estimate": {"estimate_doc", "estimate_line"}, "dplora.cli.export": {"check_export"},
    "dplora.cli.synth": {"check_synthetic"},
    "dplora.run.outputs": {"fix_mtimes", "private_folder", "private_path", "private_staging"},
    "dplora.run.progress": {"duration"}, "dplora.run.resume": {"failure_entries", "steps_run"},
    "dplora.surface": {"PrivateLog", "echo_private", "in_ci"},
}  # fmt: skip


def _module_aliases(tree) -> dict[str, str]:
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dplora"):
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("dplora"):
                    out[a.asname or a.name] = a.name
    return out


def test_a9_no_monkeypatched_name_was_hoisted_into_a_module_level_from_import():
    """A test that patches ``module.name`` where another module now binds ``name`` at import would silently test
    nothing. Every patched (module, name) pair in tests/ must not be one a50d302 hoisted, and every hoisted name must
    still be importable from where it was hoisted (the seam exists)."""
    dead = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = _module_aliases(tree)
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setattr"
            ):
                continue
            if len(node.args) < 2:
                continue
            target, name = node.args[0], node.args[1]
            if isinstance(target, ast.Name) and isinstance(name, ast.Constant) and target.id in aliases:
                module, attr = aliases[target.id], name.value
            elif (
                isinstance(target, ast.Constant) and isinstance(target.value, str) and target.value.startswith("dplora")
            ):
                module, _, attr = target.value.rpartition(".")
            else:
                continue
            if attr in HOISTED_FROM.get(module, ()):
                dead.append(f"{path.relative_to(ROOT)}:{node.lineno} patches {module}.{attr}")
    assert dead == []
    import importlib

    for module, names in HOISTED_FROM.items():
        mod = importlib.import_module(module)
        assert all(hasattr(mod, n) for n in names), module
