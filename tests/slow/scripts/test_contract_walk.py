"""scripts/contract_walk.py: the walk from ``dplora train`` on the real package finds the command and the planner,
and on planted packages every stop is known by construction (a chain of three functions passing the contract on,
beside functions that get only an int from it, a function of another command, and a result helper; then carriers:
a dataclass holding the contract, a class that keeps one in ``self``, a section spread from a dict)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "contract_walk.py"
sys.path.insert(0, str(ROOT / "scripts"))
import contract_walk  # noqa: E402

FILES = {
    "__init__.py": "",
    "contract/__init__.py": "",
    "contract/spec.py": (
        "class PrivacySection:\n    max_grad_norm: float\n\n\n"
        "class TrainingSection:\n    seed: int\n\n\n"
        "class Contract:\n    privacy: PrivacySection\n    training: TrainingSection\n"
    ),
    # load_contract returns the contract (by annotation) but receives a path: not a stop
    "contract/loader.py": (
        "from pkg.contract.spec import Contract\n\n\n"
        "def load_contract(path) -> Contract:\n    return parse(path)\n\n\n"
        "def parse(path):\n    return path\n"
    ),
    "cli/__init__.py": "",
    # the train command registered as in dplora.cli.app; budget is another command, never walked
    "cli/app.py": (
        "import typer\n\nfrom pkg.cli import train as train_cmd\n\napp = typer.Typer()\n"
        'app.command(short_help="Train.")(train_cmd.train)\n\n\n'
        '@app.command("budget")\ndef budget(config):\n'
        "    from pkg.contract.loader import load_contract\n    from pkg.steps.a import only_budget\n\n"
        "    return only_budget(load_contract(config))\n"
    ),
    # _run makes the contract (a stop); _report is searched but holds nothing tracked (not a stop)
    "cli/train.py": (
        "def train(config):\n    _report(_run(config))\n\n\n"
        "def _report(result):\n    return result\n\n\n"
        "def _run(config):\n    from pkg.contract.loader import load_contract\n    from pkg.steps.a import first\n\n"
        "    contract = load_contract(config)\n    return first(contract)\n"
    ),
    "steps/__init__.py": "",
    # three stops: first (positional), second (keyword, through `from pkg.steps import b as b_mod`), third
    "steps/a.py": (
        "from pkg.steps import b as b_mod\n\n\n"
        "def first(contract):\n    return b_mod.second(cfg=contract)\n\n\n"
        "def only_budget(contract):\n    return contract\n"
    ),
    # takes_int gets contract.training.seed, an int: not a stop (through `import pkg.steps.c as c_mod`)
    "steps/b.py": (
        "import pkg.steps.c as c_mod\nfrom pkg.steps.c import third\n\n\n"
        "def second(cfg):\n    c_mod.takes_int(cfg.training.seed)\n    return third(cfg)\n"
    ),
    "steps/c.py": "def third(contract, n=0):\n    return n\n\n\ndef takes_int(n):\n    return n\n",
}

CHAIN = {"pkg.cli.train": ["_run", "train"], "pkg.steps.a": ["first"], "pkg.steps.b": ["second"]}

# third builds a dataclass carrier (its return inferred), hands it to a class that keeps it in self (a field learned
# in __init__, so keeper.go() is a stop by its receiver), spreads a section from a dict, and passes only an int on
CARRIERS = {
    "steps/c.py": (
        "import dataclasses\n\nfrom pkg.contract.spec import Contract\nfrom pkg.steps.d import Keeper\n\n\n"
        "@dataclasses.dataclass\nclass Spec:\n    contract: Contract\n    steps: int = 0\n\n\n"
        "def build(contract):\n    return Spec(contract=contract), 3\n\n\n"
        "def third(contract, n=0):\n    spec, count = build(contract)\n    keeper = Keeper(spec)\n    keeper.go()\n"
        '    takes_int(spec.steps)\n    kwargs = {"privacy": contract.privacy, "n": count}\n'
        "    by_kwargs(**kwargs)\n    return n\n\n\n"
        "def takes_int(n):\n    return n\n\n\n"
        "def by_kwargs(privacy, n):\n    return n\n"
    ),
    "steps/d.py": (
        "class Keeper:\n    def __init__(self, spec):\n        self.spec = spec\n        self.n = spec.steps\n\n"
        "    def go(self):\n        return use_privacy(self.spec.contract.privacy)\n\n"
        "    def idle(self):\n        return 0\n\n\n"
        "def use_privacy(privacy):\n    return privacy\n"
    ),
}


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / "pkg" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / rel).write_text(text, encoding="utf-8")
    return tmp_path / "pkg"


def test_a_chain_of_three_functions_passing_the_contract_is_three_stops_past_the_command(tmp_path):
    doc = contract_walk.walk(_package(tmp_path, FILES))
    assert doc["entry"] == "pkg.cli.train.train"
    assert doc["by_module"] == {**CHAIN, "pkg.steps.c": ["third"]}
    assert (doc["stops"], doc["modules"]) == (5, 4)


def test_carriers_a_kept_field_and_a_spread_dict_carry_the_contract(tmp_path):
    doc = contract_walk.walk(_package(tmp_path, {**FILES, **CARRIERS}))
    assert doc["by_module"] == {
        **CHAIN,
        "pkg.steps.c": ["build", "by_kwargs", "third"],
        "pkg.steps.d": ["Keeper.__init__", "Keeper.go", "use_privacy"],
    }
    assert (doc["stops"], doc["modules"]) == (10, 5)


def test_the_real_package_walk_reaches_the_planner():
    run = subprocess.run([sys.executable, str(SCRIPT), "--json"], capture_output=True, text=True, check=True)
    doc = json.loads(run.stdout)
    assert doc["entry"] == "dplora.cli.train.train"
    assert doc["stops"] > 0 and doc["modules"] == len(doc["by_module"])
    assert doc["stops"] == sum(len(quals) for quals in doc["by_module"].values())
    assert {"train", "_run"} <= set(doc["by_module"]["dplora.cli.train"])
    assert "make_plan" in doc["by_module"]["dplora.plan.training"]
    assert any("run_training" in quals for quals in doc["by_module"].values())
    line = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=True).stdout
    assert line == f"contract walk from dplora train: {doc['stops']} stops in {doc['modules']} modules\n"
