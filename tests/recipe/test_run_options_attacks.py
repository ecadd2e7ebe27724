"""Attacks on ``RunOptions`` (dplora.recipe.config): every option is read, ``dplora train`` passes every flag, and
a sweep-like run (tuning trial, no ledger release, extra records) is charged as tuning."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support.row_contract import contract_raw
from tiny import save_tiny_model

from dplora.contract.loader import parse_contract
from dplora.recipe.config import RunOptions

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def test_every_run_option_is_read():
    """Each RunOptions field is read by the code (an unread field is an option silently dropped)."""
    import ast

    fields = {f.name for f in dataclasses.fields(RunOptions)}
    read = set()
    for path in (ROOT / "dplora").rglob("*.py"):
        if path.name == "options.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in fields:
                owner = node.value
                if (isinstance(owner, ast.Name) and owner.id in {"options", "run_options", "opts"}) or (
                    isinstance(owner, ast.Attribute) and owner.attr == "options"
                ):
                    read.add(node.attr)
    assert fields - read == set()


def test_cli_train_passes_every_option(monkeypatch, tmp_path):
    """`dplora train` builds RunOptions from every flag (tuning_trial, non_private, ledger, resume...)."""
    import inspect

    from dplora.cli import train as cli_train

    src = inspect.getsource(cli_train)
    for name in ("signing_key", "data_key", "ledger_path", "overwrite", "resume", "threads", "progress",
                 "tuning_trial", "non_private", "contract_path"):  # fmt: skip
        assert f"{name}=" in src, name


def test_tuning_trial_no_ledger_release_and_canaries_are_charged(tmp_path, model_dir, monkeypatch):
    """A sweep-like run (tuning_trial, ledger_release=False) with extra_records: charged as tuning, settled at
    ε spent, no release row; the extra rows are units in the plan (N = rows + 2)."""
    from dplora.ledger.store import Ledger
    from dplora.recipe.train import run_training
    from dplora.release import envelope
    from dplora.release import keys as release_keys

    monkeypatch.delenv(envelope.DATA_KEY_ENV, raising=False)
    key = release_keys.generate_keypair(tmp_path / "k" / "s.pem")[0]
    from dplora.recipe import train as train_mod

    raw = contract_raw(tmp_path, model_dir, rows=8, privacy={"num_units": 10})  # public N: 8 rows + 2 canaries
    contract = parse_contract(raw)
    db = tmp_path / "ledger.db"
    extra = ({"text": "canary one 424242"}, {"text": "canary two 737373"})
    seen = []
    real_index = train_mod.data_mod.build_unit_index

    def index_spy(table, *args, **kwargs):
        seen.append([row["text"] for row in table])
        return real_index(table, *args, **kwargs)

    monkeypatch.setattr(train_mod.data_mod, "build_unit_index", index_spy)
    result = run_training(
        contract,
        RunOptions(
            signing_key=key,
            progress=False,
            threads=1,
            ledger_path=db,
            tuning_trial=True,
            ledger_release=False,
            extra_records=extra,
        ),
        log=lambda *_: None,
    )
    assert len(seen) == 1 and len(seen[0]) == 10 and seen[0][-2:] == [e["text"] for e in extra]
    ledger = Ledger(db, create=False)
    charges = ledger.unassigned()
    assert len(charges) == 1
    c = charges[0].to_dict()
    assert c["purpose"] == "tuning" and c["run_id"] == result.run_id
    assert float(c["epsilon"]) == pytest.approx(result.plan.epsilon)
    assert ledger.releases(result.run_id) == []
