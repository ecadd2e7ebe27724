"""Shared fixtures: a tiny model folder, demo tickets, a signing key, a contract writer. No downloads."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

# The folder beside the repository with the real datasets (../shared/data); a fresh clone has none, so every test
# that reads it skips without it (needs_shared). DPLORA_SHARED_DIR moves it: pointed at an empty folder it hides the
# data from one pytest run without moving the real folder, which other jobs read.
SHARED = Path(os.environ.get("DPLORA_SHARED_DIR") or Path(__file__).resolve().parents[1].parent / "shared")
if os.environ.get("DPLORA_SHARED_DIR"):
    # the scripts the tests run (scripts/utility_bench.py, the GPU check's dry run) read the same folder
    os.environ.setdefault("DPLORA_UTILITY_DATA", str(SHARED / "data"))


def needs_shared(*parts: str) -> pytest.MarkDecorator:
    """Skip unless ``SHARED / parts`` exists (e.g. ``needs_shared("data", "banking77")``)."""
    path = SHARED.joinpath(*parts)
    return pytest.mark.skipif(not path.exists(), reason=f"{path} is absent (../shared is not part of a clone)")


# The fast tier: ``pytest -m "not slow"`` for the edit loop; ``pytest -q -n auto --dist loadfile`` (CI, ``.ci/run``)
# for everything, one worker per core (pytest-xdist), each test file on one worker (module fixtures built once).
# A test is slow exactly when it lives under tests/slow/ (CLI training runs, multi-process runs, the 135M model, long
# checks): the folder is the tier, so moving a test between tiers is moving it, and a rename needs no second edit.
# To find candidates, measure a folder:
#     nice -n 10 env PYTHONPATH=$PWD .venv/bin/pytest -q --durations=60 tests/<folder>
SLOW_DIR = Path(__file__).parent / "slow"


def in_slow_tier(path: Path, slow_dir: Path = SLOW_DIR) -> bool:
    """Whether the test file ``path`` lies under ``slow_dir`` (tests/slow/ by default); both resolved."""
    return slow_dir.resolve() in Path(path).resolve().parents


@pytest.hookimpl(tryfirst=True)  # before the mark plugin's own hook applies ``-m``
def pytest_collection_modifyitems(config, items):
    for item in items:
        if in_slow_tier(item.path):
            item.add_marker(pytest.mark.slow)
    # The slow tier first (a stable sort: each tier keeps its order). Under ``-n auto --dist loadfile`` (CI) the
    # workers take files in this order, so the many short fast-tier files fill the end instead of one long file
    # leaving a core idle.
    items.sort(key=lambda item: not in_slow_tier(item.path))


def _isolate(patch: pytest.MonkeyPatch, base: Path) -> None:
    patch.setenv("DPLORA_CACHE_DIR", str(base / "dplora-cache"))
    patch.setenv("DPLORA_LEDGER", str(base / "ledger.sqlite3"))
    patch.delenv("DPLORA_SIGNING_KEY", raising=False)
    patch.delenv("DPLORA_DATA_KEY", raising=False)
    for name in ("JPY_PARENT_PID", "GIT_PAGER"):  # pytest run from a notebook cell: its tests of a terminal still hold
        patch.delenv(name, raising=False)


@pytest.fixture(scope="session", autouse=True)
def _isolated_session(tmp_path_factory):
    """The same isolation for the whole session, so that module- and session-scoped fixtures (set up before any
    function-scoped fixture) never write the user's ledger or cache either."""
    with pytest.MonkeyPatch.context() as patch:
        _isolate(patch, tmp_path_factory.getbasetemp())
        yield


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory):
    """Calibration cache and ledger in per-session temporary folders (never the user's).

    A MonkeyPatch of its own, so that a test's ``monkeypatch.undo()`` does not send later commands of that test to
    the user's ledger and cache."""
    with pytest.MonkeyPatch.context() as patch:
        _isolate(patch, tmp_path_factory.getbasetemp())
        yield


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A calibration cache of the test's own (``pytestmark = pytest.mark.usefixtures("fresh_cache")``): no result
    depends on a calibration an earlier test left in the session's cache."""
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tickets_csv(tmp_path_factory) -> Path:
    from dplora.data.demo import write_tickets

    path = tmp_path_factory.mktemp("tickets") / "tickets.csv"
    write_tickets(path, num_tickets=120, seed=1)
    return path


@pytest.fixture(scope="session")
def signing_key(tmp_path_factory) -> tuple[Path, Path]:
    from dplora.release.keys import generate_keypair

    folder = tmp_path_factory.mktemp("keys")
    return generate_keypair(folder / "test.key")


# The privacy section every small test contract starts from: row level, add/remove, (8, 1e-5), C = 1 (the accountant
# is each contract's own choice).
ROW_PRIVACY = {
    "protected_unit": "row",
    "adjacency": "add_remove",
    "target_epsilon": 8.0,
    "delta": 1e-5,
    "max_grad_norm": 1.0,
}


# The privacy section of the contracts that only tokenize (no accountant runs): ROW_PRIVACY at ε = 3.
TOKENIZE_PRIVACY = {**ROW_PRIVACY, "target_epsilon": 3.0}


def contract_base(model_dir: Path, data_path: Path, out_dir: Path, **sections) -> dict:
    """``contract_dict`` without its declared ``num_units``: the sections exactly as given."""
    raw = {
        "privacy": {
            **ROW_PRIVACY,
            "accountant": "rdp",
        },
        "model": {"path": str(model_dir)},
        "data": {"path": str(data_path), "prompt_column": "message", "response_column": "reply"},
        "lora": {"r": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]},
        "training": {
            "expected_batch_size": 8,
            "physical_batch_size": 4,
            "steps": 3,
            "lr": 0.01,
            "max_seq_len": 48,
            "seed": 0,
            "output_dir": str(out_dir),
            "threads": 1,
        },
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return raw


def contract_dict(model_dir: Path, data_path: Path, out_dir: Path, **sections) -> dict:
    """A small valid row-level contract for the tiny model; ``sections`` update each section's keys."""
    raw = contract_base(model_dir, data_path, out_dir, **sections)
    if "num_units" not in raw["privacy"]:
        _declare_num_units(raw)
    return raw


def _declare_num_units(raw: dict) -> None:
    """Declare the test data's count as the public N where it is private (add/remove, or a held-out split).

    Test data is synthetic and public, so its count may be declared; a release under add/remove needs a declared
    N. Pass ``privacy={"num_units": None}`` to leave it undeclared. Data that cannot be read is left to the test.
    """
    from dplora.contract.loader import parse_contract
    from dplora.data import units as data
    from dplora.errors import DploraError
    from dplora.plan.resolve import private_count_reason

    try:
        contract = parse_contract(raw)
        if private_count_reason(contract) is not None:
            key, seed = contract.privacy.unit_key, contract.training.seed
            table = _LOAD_TABLE(contract.data, unit_key=key)  # the reader a test may monkeypatch
            table, _ = data.split_eval(table, contract.data, unit_key=key, seed=seed)
            index = data.build_unit_index(table, contract.privacy, seed=contract.training.seed)
            raw["privacy"]["num_units"] = index.num_units
    except (DploraError, ValueError, OSError):
        pass


def _original_load_table():
    from dplora.data.units import load_table

    return load_table


_LOAD_TABLE = _original_load_table()


def write_contract(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


def release_statement(path: Path) -> dict:
    """The in-toto statement signed in a release (``path``: the release folder or its ``release.dsse.json``).

    Read only: the signature is not checked here (``dplora verify`` and its tests do that).
    """
    import base64
    import json

    envelope_path = path / "release.dsse.json" if path.is_dir() else path
    envelope = json.loads(envelope_path.read_text())
    return json.loads(base64.b64decode(envelope["payload"]))


def train_contract(cfg: Path, signing_key_path, *extra: str):
    """``dplora train CFG --signing-key KEY --no-progress EXTRA`` in-process, as the console script runs it: the
    click result (exit code, stdout, stderr)."""
    from typer.testing import CliRunner

    from dplora.cli.app import app

    args = ["train", str(cfg), "--signing-key", str(signing_key_path), "--no-progress", *map(str, extra)]
    return CliRunner().invoke(app, args)


def train_tiny(tmp_path: Path, model_dir: Path, data_path: Path, signing_key, *extra, name="run", **sections):
    """``dplora train`` in-process on :func:`contract_dict` (``sections`` update it), the contract written as
    ``tmp_path/NAME.yaml``: (click result, output dir ``tmp_path/NAME``)."""
    cfg = write_contract(tmp_path / f"{name}.yaml", contract_dict(model_dir, data_path, tmp_path / name, **sections))
    return train_contract(cfg, signing_key[0], *extra), tmp_path / name


def trained_once(tmp_path_factory, folder: str, model_dir: Path, data_path: Path, signing_key, *extra, **kw):
    """A module fixture's run: ``train_tiny`` in a fresh folder named FOLDER; it must exit 0. (result, output)"""
    result, out = train_tiny(tmp_path_factory.mktemp(folder), model_dir, data_path, signing_key, *extra, **kw)
    assert result.exit_code == 0, result.output
    return result, out


def train_ok(tmp_path: Path, model_dir: Path, data_path: Path, signing_key, *extra, name="run", **sections) -> Path:
    """:func:`train_tiny` that must exit 0: the output dir."""
    result, out = train_tiny(tmp_path, model_dir, data_path, signing_key, *extra, name=name, **sections)
    assert result.exit_code == 0, result.output
    return out


def moved_release(tmp: Path, model_dir: Path, data_csv: Path, signing_key, at_home=None) -> dict:
    """A release moved away from where it was trained, for the tests of ``--data``/``--model``.

    The run is trained in ``tmp/trained`` with relative paths (``data/tickets.csv``, ``model``, ``run``),
    ``eval_fraction`` 0.25 and the data key ``tmp/data.key``, then copied alone to ``tmp/moved/run``; the trained
    data is copied as ``elsewhere/renamed.csv``, other rows with the same columns are ``elsewhere/other.csv``, the
    model is ``elsewhere/base``, and ``tmp/cwd`` is empty. ``at_home(runner)`` runs from the training folder right
    after training (``DPLORA_DATA_KEY`` unset); its result is under ``"home"``. Returns the paths by name.
    """
    import shutil

    from typer.testing import CliRunner

    from dplora.cli.app import app
    from dplora.data.demo import write_tickets

    runner = CliRunner()
    trained = tmp / "trained"
    (trained / "data").mkdir(parents=True)
    shutil.copy(data_csv, trained / "data" / "tickets.csv")
    shutil.copytree(model_dir, trained / "model")
    key = tmp / "data.key"
    key.write_bytes(b"k" * 32)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(trained)
        mp.delenv("DPLORA_DATA_KEY", raising=False)
        raw = contract_dict(Path("model"), Path("data/tickets.csv"), Path("run"), data={"eval_fraction": 0.25})
        cfg = write_contract(trained / "contract.yaml", raw)
        args = ["train", str(cfg), "--signing-key", str(signing_key[0]), "--data-key", str(key), "--no-progress"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        home = at_home(runner) if at_home is not None else None
    (tmp / "moved").mkdir()
    shutil.copytree(trained / "run", tmp / "moved" / "run")
    (tmp / "elsewhere").mkdir()
    shutil.copy(data_csv, tmp / "elsewhere" / "renamed.csv")
    shutil.copytree(model_dir, tmp / "elsewhere" / "base")
    write_tickets(tmp / "elsewhere" / "other.csv", num_tickets=120, seed=2)  # same columns, other rows
    (tmp / "cwd").mkdir()
    return {
        "tmp": tmp,
        "trained": trained,
        "run": tmp / "moved" / "run",
        "data": tmp / "elsewhere" / "renamed.csv",
        "model": tmp / "elsewhere" / "base",
        "other": tmp / "elsewhere" / "other.csv",
        "key": key,
        "cwd": tmp / "cwd",
        "home": home,
    }


# A tiny three-intent classification set (message → reply = the intent), for the classification tests.
INTENT_LABELS = ["refund", "shipping", "lost_or_stolen_card"]
INTENT_PROMPTS = {
    "refund": ["I want my money back", "refund my order please", "charged twice, refund"],
    "shipping": ["where is my parcel", "when does it ship", "tracking number missing"],
    "lost_or_stolen_card": ["my card was stolen", "I lost my card", "someone took my card"],
}


def write_intents(path: Path, rows: list[tuple[str, str]]) -> Path:
    """``rows`` of (message, reply) as a csv with the header ``message,reply``."""
    import csv

    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["message", "reply"])
        writer.writerows(rows)
    return path


def intent_rows(copies: int) -> list[tuple[str, str]]:
    """Every prompt of every intent ``copies`` times (numbered, so no two rows are equal): 9·copies rows."""
    return [(f"{p} #{i}", label) for i in range(copies) for label in INTENT_LABELS for p in INTENT_PROMPTS[label]]


def minimal_contract(*, max_len: int, text: bool = False):
    """A parsed row-level contract with no data or model behind it (paths unused), for tokenizing tests."""
    from dplora.contract.loader import parse_contract

    data = {"path": "unused.csv"}
    data.update({"text_column": "text"} if text else {"prompt_column": "message", "response_column": "reply"})
    return parse_contract(
        {
            "privacy": {**TOKENIZE_PRIVACY},
            "model": {"path": "unused"},
            "data": data,
            "training": {"expected_batch_size": 1, "steps": 1, "max_seq_len": max_len},
        }
    )


def reserve_charge(ledger, population, run_id: str, epsilon, delta="1e-6", **kw):
    """``ledger.reserve`` with the usual test terms: row level, RDP, add/remove (``kw`` overrides or adds any)."""
    kw = {"accountant": "rdp", "adjacency": "add_remove", "protected_unit": "row", **kw}
    return ledger.reserve(population=population, run_id=run_id, epsilon=epsilon, delta=delta, **kw)


def set_cap_args(population: str, db: Path, *, epsilon="10", delta="1e-4", unit="row", adjacency="add_remove"):
    """The arguments of ``dplora ledger set-cap`` (after ``ledger``) that cap POPULATION in the ledger DB."""
    caps = ["--epsilon", str(epsilon), "--delta", str(delta), "--unit", unit, "--adjacency", adjacency]
    return ["set-cap", population, *caps, "--db", str(db)]


def ledger_with_charges(db: Path, events_per_charge: list[list[dict]], *, epsilon: str = "1") -> Path:
    """A ledger at ``db`` with population ``p`` (row, add/remove) and one reserved charge per event list."""
    from dplora.ledger.store import Ledger

    with Ledger(db) as led:
        led.set_cap("p", epsilon_max="30", delta_max="1e-4", protected_unit="row", adjacency="add_remove")
        for i, events in enumerate(events_per_charge):
            reserve_charge(led, "p", f"r{i}", epsilon, accountant="pld", events=events)
    return db


def ledger_show_json(db: Path):
    """``dplora ledger show --db DB --json`` through typer's runner (the result: exit_code, stdout, exception)."""
    import typer
    from typer.testing import CliRunner

    from dplora.cli.ledger import ledger_app

    app = typer.Typer()
    app.add_typer(ledger_app, name="ledger")

    @app.command()
    def _noop() -> None:  # a second command keeps "ledger" a sub-command
        pass

    return CliRunner().invoke(app, ["ledger", "show", "--db", str(db), "--json"])


def contract_table(contract):
    """The contract's data file as train reads it (``load_table`` with the contract's unit key)."""
    from dplora.data.units import load_table

    return load_table(contract.data, unit_key=contract.privacy.unit_key)


def contract_records(table, tokenizer, contract):
    """``tokenize_records`` with the contract's data section and ``training.max_seq_len``."""
    from dplora.data.tokens import tokenize_records

    return tokenize_records(table, tokenizer, contract.data, max_seq_len=contract.training.max_seq_len)


BUDGET_PROBE = """\
import json, sys
from dplora.cli.app import main
sys.argv = ["dplora", *sys.argv[1:]]
try:
    main()
except SystemExit as exit:
    code = exit.code
heavy = [m for m in ("torch", "transformers", "peft", "opacus", "datasets", "pandas") if m in sys.modules]
print("PROBE" + json.dumps({"code": code, "heavy": heavy}))
"""


def budget_in_subprocess(tmp_path: Path, *args: str) -> tuple[dict, dict, str]:
    """``dplora budget contract.yaml --json --show-private ARGS`` in a fresh interpreter in ``tmp_path``:
    (``{"code": exit code, "heavy": torch-stack or datasets/pandas modules it imported}``, the JSON report, stderr)."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), DPLORA_CACHE_DIR=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", BUDGET_PROBE, "budget", "contract.yaml", "--json", "--show-private", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    probe = json.loads(proc.stdout.rsplit("PROBE", 1)[1])
    return probe, json.loads(proc.stdout.rsplit("PROBE", 1)[0]), proc.stderr
