"""The training run's shape, checked on the source (``ast``): the stages below the recipe never take the contract,
the control switch below planning is the mechanism's, the ledger is called from the charge object only, and the
record, the card and ``train --json`` have one writer. Each rule's checker is also run on a planted offender, so a
checker that cannot fail fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dplora"
NO_CONTRACT = ("run", "engine", "mechanism")  # compiled settings only (dplora.run.config.RunConfig)


def _contract_types() -> set[str]:
    """``Contract`` and every section class of ``dplora/contract/spec.py`` (subclasses of ``_Section``)."""
    tree = ast.parse((PACKAGE / "contract" / "spec.py").read_text())
    names = {"Contract"}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "_Section" for b in node.bases):
            names.add(node.name)
    return names


def contract_parameters(source: str, types: set[str]) -> list[str]:
    """``function(parameter: Type)`` for every parameter annotated with one of ``types`` (also inside ``X | None``,
    quoted annotations and dotted names such as ``spec.Contract``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = node.args
        for arg in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
            if arg is None or arg.annotation is None:
                continue
            text = ast.unparse(arg.annotation).strip("'\"")
            words = {w.rsplit(".", 1)[-1] for w in text.replace("|", " ").replace("[", " ").replace("]", " ").split()}
            if words & types:
                found.append(f"{node.name}({arg.arg}: {text})")
    return found


def _modules(*packages: str):
    for package in packages:
        yield from sorted((PACKAGE / package).rglob("*.py"))


def test_the_contract_types_are_found():
    types = _contract_types()
    assert {"Contract", "PrivacySection", "ModelSection", "DataSection", "LoraSection", "TrainingSection"} <= types


def test_no_function_below_the_recipe_takes_the_contract_or_a_section():
    types = _contract_types()
    offenders = {
        str(path.relative_to(PACKAGE)): hits
        for path in _modules(*NO_CONTRACT)
        if (hits := contract_parameters(path.read_text(), types))
    }
    assert offenders == {}


def test_a_planted_function_that_takes_a_section_is_caught():
    types = _contract_types()
    planted = (
        "from dplora.contract.spec import TrainingSection\n"
        "def loop_step(spec, training: TrainingSection | None = None):\n    return training.lr\n"
        "def ok(model: 'ModelSpec', n: int):\n    return n\n"
        "async def quoted(*, privacy: 'spec.PrivacySection'):\n    return privacy\n"
    )
    assert contract_parameters(planted, types) == [
        "loop_step(training: TrainingSection | None)",
        "quoted(privacy: spec.PrivacySection)",
    ]


def test_nothing_reads_a_contract_off_the_run_spec():
    hits = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "spec.contract" in p.read_text()]
    assert hits == []


def calls_to(source: str, names: set[str]) -> list[str]:
    """Calls of a function or method named in ``names`` (``f(...)``, ``module.f(...)``, ``obj.f(...)``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in names:
                found.append(f"{name} (line {node.lineno})")
    return found


def record_key_writes(source: str) -> list[str]:
    """Assignments into a mapping named ``record`` (``record[...] = ...``, ``record.update(...)``,
    ``record.setdefault(...)``, ``record |= ...``): a key written outside the one writer."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            base = t.value if isinstance(t, ast.Subscript) else t if isinstance(node, ast.AugAssign) else None
            if isinstance(base, ast.Name) and base.id == "record":
                found.append(f"record write (line {node.lineno})")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"update", "setdefault", "pop"}
            and getattr(node.func.value, "id", None) == "record"
        ):
            found.append(f"record.{node.func.attr} (line {node.lineno})")
    return found


# The writer (release/report.py) and the modules it is made of: the record's sections (release/record.py), the
# signed envelope with its artifacts list and card (release/envelope.py), the card's words (release/card.py).
WRITER = {"release/report.py", "release/record.py", "release/envelope.py", "release/card.py"}
BUILDERS = {"build_record", "non_private_record", "finish_release", "write_release", "finish_adapter_dir", "model_card"}


def test_the_record_and_the_card_are_written_by_the_one_writer_only():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        if rel in WRITER:
            continue
        source = path.read_text()
        hits = calls_to(source, BUILDERS) + record_key_writes(source)
        if hits:
            offenders[rel] = hits
    assert offenders == {}


def test_a_planted_record_writer_is_caught():
    planted = (
        "from dplora.release.record import build_record\n"
        "def finish(spec, record):\n"
        "    record['empty_steps'] = spec.empty_steps\n"
        "    record |= {'seconds': 1}\n"
        "    record.update(peak=2)\n"
        "    return build_record(contract=spec)\n"
    )
    assert record_key_writes(planted) == ["record write (line 3)", "record write (line 4)", "record.update (line 5)"]
    assert calls_to(planted, BUILDERS) == ["build_record (line 6)"]


def test_train_json_is_the_writers_summary():
    """``dplora train --json`` prints only the one writer's summary or the shared error document."""
    source = (PACKAGE / "cli" / "train.py").read_text()
    printed = []
    paths = [n for n in ast.walk(ast.parse(source)) if getattr(n, "name", None) in {"train", "_run", "_report"}]
    for node in (n for fn in paths for n in ast.walk(fn)):  # the train command's path (budget shares the module)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "emit_json":
            arg = node.args[0]
            printed.append(getattr(arg.func, "id", None) if isinstance(arg, ast.Call) else type(arg).__name__)
    assert printed and set(printed) <= {"_train_summary", "error_doc"}, printed
    summary = next(
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "_train_summary"
    )
    assert ast.unparse(summary.body[-1]) == "return result.summary"
    makers = {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if calls_to(p.read_text(), {"train_summary"}) and p.name != "report.py"
    }
    assert makers == {"recipe/train.py"}, "train --json must come from release.report.train_summary"


def test_is_control_is_asked_at_planning_only():
    """Below planning the one control switch is the compiled ``private`` (the mechanism's)."""
    below = ("run", "engine", "mechanism", "release", "recipe", "ledger", "evaluate", "data")
    hits = {
        str(p.relative_to(PACKAGE)): c
        for p in _modules(*below)
        if (c := calls_to(p.read_text(), {"is_control"})) and p.name != "control.py"
    }
    assert hits == {}


def ledger_calls(source: str) -> list[str]:
    """Calls of a ledger's charge methods (on anything named like a ledger: ``ledger``, ``self.ledger``)."""
    methods = {"reserve", "reserve_non_private", "settle", "record_release", "set_checkpoint_path", "charge"}
    return [
        ast.unparse(n.func)
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in methods
        and "ledger" in ast.unparse(n.func.value)
    ]


def test_the_ledger_is_called_from_the_charge_object_only():
    """The training run calls the ledger's charge methods through ``dplora.ledger.charge.RunCharge`` alone: no
    module of the recipe or the run calls them, and the charge module holds that one class."""
    for path in _modules("recipe", "run"):
        assert ledger_calls(path.read_text()) == [], path
    tree = ast.parse((PACKAGE / "ledger" / "charge.py").read_text())
    assert [n.name for n in tree.body if isinstance(n, ast.ClassDef)] == ["RunCharge"]


def test_a_planted_ledger_call_outside_the_charge_is_caught():
    planted = (
        "def publish(self, spec, ledger):\n    ledger.settle(spec.run_id, epsilon_spent=1.0)\n"
        "    self.ledger.record_release(run_id=spec.run_id)\n    spec.settle()\n"
    )
    assert ledger_calls(planted) == ["ledger.settle", "self.ledger.record_release"]
