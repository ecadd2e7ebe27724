"""Red team of issue 44 (the narrowing refactor: functions take the contract's sections, not the ``Contract``;
56 function-level imports hoisted to module headers). Each test states a guarantee the refactor could have broken
and FAILS if it no longer holds. No model is trained: data, ledger and resume checks are called directly, and the
ranks' digests come from ``train._admit`` on a second rank with the collectives stubbed.

Attacks (see the report of red team 44):
  A1 eval_fraction split by unit: one side per unit, the keyed-hash rule, same split in budget/train/eval.
  A2 eval_path without (or with a blank) unit key column: read, never refused; no cell text in errors.
  A3 row-level eval_fraction: the unit id is the record's text (duplicates fall together).
  A4 public sample (clip-guide --public / sweep --eval-public): the unit key read only with ``units``; private
     files (data.path, a non-public eval_path, a symlink to either) refused.
  A5 resume: a changed unit key, or data changed only in its unit key column, refused.
  A6 ranks' input digests cover the unit key column (through train._admit).
  A7 synth's verbatim check reads the data as training does (with the unit key).
  A8 ledger charges of a control (privacy.enabled: false) after is_control takes the privacy section.
  A9 no name a test monkeypatches was hoisted into a module-level ``from ... import`` (a dead seam).
  A10 ``dplora budget`` stays light with --sweep and an eval_path lacking the unit key.
"""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from dplora.contract.loader import parse_contract
from dplora.data import public as public_data
from dplora.data import units as data_mod
from dplora.errors import BadInputError, PlanRefusedError

ROOT = Path(__file__).resolve().parents[2]


SEED = 7


def _csv(path: Path, header: str, rows: list[str]) -> str:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return str(path)


def _contract(tmp_path: Path, data_path: str, *, unit="user", key="user_id", privacy=None, **data):
    priv = {"protected_unit": unit, "adjacency": "add_remove", "target_epsilon": 8, "delta": 1e-5,
            "max_grad_norm": 1.0, "num_units": 50, **(privacy or {})}  # fmt: skip
    if key:
        priv.update(unit_key=key, max_records_per_unit=3)
    raw = {
        "privacy": priv,
        "model": {"path": "/nonexistent"},
        "data": {"path": data_path, "prompt_column": "message", "response_column": "reply", **data},
        "training": {"expected_batch_size": 8, "steps": 5, "seed": SEED, "output_dir": str(tmp_path / "out")},
    }
    return parse_contract(raw)


@pytest.fixture
def tickets(tmp_path):
    rows = [f"u{i % 7},t{i % 13},question {i},answer {i},L{i % 2}" for i in range(80)]
    return _csv(tmp_path / "data.csv", "user_id,ticket,message,reply,label", rows)


@pytest.fixture
def rank1(monkeypatch):
    """``train._admit`` as rank 1 of 2 (reads and splits the data, never the keys or the ledger), the collectives
    stubbed; returns (admit(contract) -> _Admitted, the digests each call handed to check_same_inputs)."""
    from dplora.engine import distributed
    from dplora.recipe import train as train_mod
    from dplora.recipe.config import RunOptions

    seen = []
    monkeypatch.setattr(distributed, "gate", lambda world: contextlib.nullcontext())
    monkeypatch.setattr(distributed, "broadcast", lambda world, obj: SimpleNamespace(to_dict=lambda: {"s": 1}))
    monkeypatch.setattr(distributed, "check_same_inputs", lambda world, digests: seen.append(digests))
    world = distributed.World(rank=1, world_size=2, local_rank=1, local_world_size=2, backend="gloo")

    def admit(contract):
        return train_mod._admit(contract, RunOptions(progress=False), world, None, train_mod._Held(), lambda *_: None)

    return admit, seen


def _load(contract, light=False):
    return data_mod.load_table(contract.data, unit_key=contract.privacy.unit_key, light=light)


def _split(contract, light=False):
    table = _load(contract, light)
    return data_mod.split_eval(table, contract.data, unit_key=contract.privacy.unit_key, seed=SEED, light=light)


def test_a1_eval_fraction_splits_by_unit_with_the_keyed_hash_everywhere(tmp_path, tickets, rank1):
    from dplora.evaluate.heldout import held_out_table

    contract = _contract(tmp_path, tickets, eval_fraction=0.4)
    admitted = rank1[0](contract)  # what `dplora train` splits
    train, held = admitted.table, admitted.held_out
    train_users, held_users = set(train["user_id"]), set(held["user_id"])
    assert train_users and held_users and not train_users & held_users  # a unit never straddles the split
    for user in train_users | held_users:  # the documented rule: held out iff the keyed hash is below the fraction
        assert (user in held_users) is data_mod._held_out_unit(user, SEED, 0.4)
    # `dplora eval` re-derives the same held-out set; `dplora budget` (light reader) the same training units
    again = held_out_table(contract.data, unit_key="user_id", seed=SEED)
    assert again["message"] == held["message"] and again["user_id"] == held["user_id"]
    light_train, light_held = _split(contract, light=True)
    assert list(light_train["message"]) == list(train["message"])
    assert list(light_held["message"]) == list(held["message"])
    index = data_mod.count_units(contract.data, contract.privacy, seed=SEED)
    assert index.num_units == len(train_users) == admitted.unit_index.num_units
    assert [list(g) for g in index.records_of_unit] == [list(g) for g in admitted.unit_index.records_of_unit]
    # the ticket key is not the user key: the split follows privacy.unit_key, not the first key-like column
    by_ticket = _contract(tmp_path, tickets, unit="ticket", key="ticket", eval_fraction=0.4)
    t_admitted = rank1[0](by_ticket)
    t_train, t_held = t_admitted.table, t_admitted.held_out
    assert not set(t_train["ticket"]) & set(t_held["ticket"])
    assert all((t in set(t_held["ticket"])) is data_mod._held_out_unit(t, SEED, 0.4) for t in set(t_train["ticket"]))


def test_a2_eval_path_without_or_with_blank_unit_key_is_read_not_refused(tmp_path, tickets, rank1):
    from dplora.evaluate.heldout import held_out_table
    from dplora.tuning import sweep

    no_key = _csv(tmp_path / "held.csv", "message,reply,label", [f"eq{i},ea{i},L1" for i in range(6)])
    blank_key = _csv(tmp_path / "held_blank.csv", "user_id,message,reply", [",eq,ea", "u1,eq2,ea2"])
    for path in (no_key, blank_key):
        contract = _contract(tmp_path, tickets, eval_path=path)
        admitted = rank1[0](contract)  # what `dplora train` reads
        train, held = admitted.table, admitted.held_out
        assert train.num_rows == 80 and held.num_rows == len(Path(path).read_text().splitlines()) - 1
        assert data_mod.count_units(contract.data, contract.privacy, seed=SEED).num_units == 7  # budget reads it too
        assert held_out_table(contract.data, unit_key="user_id", seed=SEED).num_rows == held.num_rows  # dplora eval
        # --eval-path FILE / sweep --eval-private FILE: read with no unit key, whatever the contract's unit
        explicit = held_out_table(contract.data, Path(path), unit_key="user_id", seed=SEED)
        assert explicit.num_rows == held.num_rows
        options = SimpleNamespace(select_by=sweep.SelectBy.PRIVATE, eval_file=Path(path))
        assert sweep._selection_table(contract, options)[0].num_rows == held.num_rows
    # the training file keeps its unit-key check: a blank key there is refused, naming rows, never a cell's text
    bad = _csv(tmp_path / "bad.csv", "user_id,message,reply", ["u1,SECRET-Q1,SECRET-A1", ",SECRET-Q2,SECRET-A2"])
    with pytest.raises(BadInputError, match="'user_id' has 1 empty cells") as err:
        _load(_contract(tmp_path, bad))
    assert "SECRET" not in str(err.value) and "u1" not in str(err.value)
    # and an eval file with an empty text cell is refused without showing any cell of it
    bad_eval = _csv(tmp_path / "bad_eval.csv", "user_id,message,reply", ["SECRET-U,SECRET-Q,", "SECRET-U2,q,a"])
    with pytest.raises(BadInputError) as err:
        _split(_contract(tmp_path, tickets, eval_path=bad_eval))
    assert "SECRET" not in str(err.value)


def test_a3_row_level_split_keys_on_the_record_text(tmp_path):
    rows = [f"q{i % 30},a{i % 30}" for i in range(90)]  # every record three times
    path = _csv(tmp_path / "rows.csv", "message,reply", rows)
    contract = _contract(tmp_path, path, unit="row", key=None, eval_fraction=0.3)
    train, held = _split(contract)
    pairs = lambda t: set(zip(t["message"], t["reply"], strict=True))  # noqa: E731
    assert pairs(train) and pairs(held) and not pairs(train) & pairs(held)  # identical records fall together
    for m, r in pairs(train) | pairs(held):
        assert ((m, r) in pairs(held)) is data_mod._held_out_unit(f"{m}\x1f{r}", SEED, 0.3)


def test_a4_public_sample_reads_the_unit_key_only_with_units_and_refuses_private_files(tmp_path, tickets):
    public = _csv(tmp_path / "public.csv", "message,reply", [f"pq{i},pa{i}" for i in range(5)])
    non_public_eval = _csv(tmp_path / "eval.csv", "message,reply", ["eq,ea"])
    contract = _contract(tmp_path, tickets, eval_path=non_public_eval)

    def table(path, units, c=contract):
        return public_data.public_table(c.data, c.privacy, path, num_tickets=4, option="--public", units=units)

    # sweep --eval-public (units=False): no unit key needed; clip-guide --public (units=True): the unit key is
    # needed to group the sample into units, and its absence is refused naming the column
    assert table(Path(public), units=False)[0].num_rows == 5
    with pytest.raises(BadInputError, match="no column 'user_id'"):
        table(Path(public), units=True)
    demo, source = table(None, units=True)
    assert "user_id" in demo.column_names and "public by construction" in source
    link = tmp_path / "link.csv"
    link.symlink_to(tickets)
    for private in (Path(tickets), Path(non_public_eval), link):
        for units in (True, False):
            with pytest.raises(BadInputError, match="data.path|data.eval_path"):
                table(private, units=units)
    declared = _contract(tmp_path, tickets, eval_path=non_public_eval, eval_public=True)
    assert table(Path(non_public_eval), units=False, c=declared)[0].num_rows == 1  # declared public: allowed
    # the data section used to evaluate on a public table keeps label_column only where the table has it
    labelled = _contract(tmp_path, tickets, label_column="label", eval_fraction=0.2)
    assert public_data.eval_data(labelled.data, table(Path(public), units=False)[0]).label_column is None


def _info(contract, index, digest, plan):
    meta = {
        "contract_yaml": contract.to_yaml(),
        "data": {"sha256": digest, "num_records": index.num_records, "num_units": index.num_units},
        "plan": plan.to_dict(),
        "accountant_history": [],
    }
    return SimpleNamespace(meta=meta, step=1, path=Path("ckpt"))


def test_a5_resume_refuses_a_changed_unit_key_or_data_changed_only_in_its_unit_key(tmp_path):
    from dplora.data.digest import sha256_file
    from dplora.run.resume import check_resumable, resume_point

    rows = [f"u{i % 5},v{i % 4},q{i},a{i}" for i in range(20)]
    path = _csv(tmp_path / "d.csv", "user_id,other,message,reply", rows)
    saved = {"steps": 5, "sample_rate": 0.1, "noise_multiplier": 1.0, "accountant": "prv", "delta": 1e-5,
             "max_grad_norm": 1.0, "num_units": 5}  # fmt: skip
    plan = SimpleNamespace(to_dict=lambda: saved, noise_multiplier=1.0, sample_rate=0.1, steps=5)
    contract = _contract(tmp_path, path)
    index = data_mod.build_unit_index(_load(contract), contract.privacy, seed=SEED)
    info = _info(contract, index, sha256_file(Path(path)), plan)
    check_resumable(info, contract.to_yaml(), path, plan, index, sha256_file(Path(path)))  # same: accepted

    rekeyed = _contract(tmp_path, path, key="other")  # another unit key column: the contract check refuses first
    with pytest.raises(BadInputError, match=r"contract changed.*privacy\.unit_key"):
        check_resumable(info, rekeyed.to_yaml(), path, plan, index, sha256_file(Path(path)))

    # the same rows and unit count, only the unit key values swapped between two users: a different file
    swapped = [r.replace("u1,", "uX,").replace("u2,", "u1,").replace("uX,", "u2,") for r in rows]
    _csv(tmp_path / "d.csv", "user_id,other,message,reply", swapped)
    now = data_mod.build_unit_index(_load(contract), contract.privacy, seed=SEED)
    assert (now.num_records, now.num_units) == (index.num_records, index.num_units)
    with pytest.raises(BadInputError, match="the data changed") as err:
        check_resumable(info, contract.to_yaml(), path, plan, now, sha256_file(Path(path)))
    assert "20" not in str(err.value).replace(str(tmp_path), "")  # no counts: they are private
    # resume_point hashes the data section's own file (not a cached or eval file)
    staging = tmp_path / "out.partial"
    assert not staging.exists()
    with pytest.raises(BadInputError):
        resume_point(staging, contract.to_yaml(), contract.data, plan, now)


def test_a6_ranks_input_digests_cover_the_unit_key_column(tmp_path, rank1):
    admit, seen = rank1
    rows = [f"u{i % 6},q{i},a{i}" for i in range(24)]
    a = _csv(tmp_path / "a.csv", "user_id,message,reply", rows)
    # rank 1's own copy of data.path on another node: the same records, one user's key renamed (same grouping)
    b = _csv(tmp_path / "b.csv", "user_id,message,reply", [r.replace("u0,", "u9,") for r in rows])
    for path in (a, b):
        admit(_contract(tmp_path, path))
    assert len(seen) == 2 and seen[0]["num_units"] == seen[1]["num_units"]
    assert seen[0]["data_sha256"] != seen[1]["data_sha256"]  # the unit key column is in the digest


def test_a7_synth_verbatim_check_reads_the_data_as_training_does(tmp_path):
    from dplora.synth.files import memorisation_counts

    path = _csv(tmp_path / "d.csv", "user_id,message,reply", ["u1,q1,a1", "u2,q2,a2"])
    contract = _contract(tmp_path, path)
    rows = [{"message": "q1", "reply": "a1"}, {"message": "zz", "reply": "a2"}, {"message": "x", "reply": "y"}]
    memo = memorisation_counts(rows, contract.data, lambda _m: None, unit_key="user_id")
    assert memo["checked"] is True and memo["flagged_rows"] == [0] and memo["flagged_generated_rows"] == [0, 1]
    # a data file training would refuse (the unit key column gone) is not silently compared as if it were fine
    _csv(tmp_path / "d.csv", "message,reply", ["q1,a1", "q2,a2"])
    memo = memorisation_counts(rows, contract.data, lambda _m: None, unit_key="user_id")
    assert memo["checked"] is False


def _plan():
    from dplora.accounting.events import Accountant, Adjacency

    return SimpleNamespace(
        epsilon=float("inf"), delta=1e-5, accountant=Accountant.PRV, adjacency=Adjacency.ADD_REMOVE, steps=5,
        to_dict=lambda: {},
    )  # fmt: skip


def test_a8_control_runs_are_charged_infinity_on_a_population_and_nothing_without(tmp_path, monkeypatch):
    from dplora.ledger.charge import RunCharge
    from dplora.ledger.store import Ledger
    from dplora.plan.resolve import is_control

    path = _csv(tmp_path / "d.csv", "user_id,message,reply", ["u1,q1,a1"])
    dp = _contract(tmp_path, path)
    ctrl = _contract(tmp_path, path, privacy={"enabled": False})
    on_pop = _contract(tmp_path, path, privacy={"enabled": False, "population": "tickets-eu"})
    assert is_control(ctrl.privacy) and not is_control(dp.privacy)

    def charge(contract, **options):
        config = SimpleNamespace(
            plan=_plan(), private=contract.privacy.enabled, population=contract.privacy.population or None
        )
        output_dir = contract.training.output_dir
        return RunCharge(
            contract.privacy, config, output_dir=output_dir, ledger_path=tmp_path / "ledger.sqlite3", **options
        )

    # a control without population: no ledger, no charge
    c = charge(ctrl)
    assert c.open(None) is None
    c.reserve("run-ctrl", resumed=False, checkpoint_dir=tmp_path)
    assert c.ledger is None and not (tmp_path / "ledger.sqlite3").exists()
    # on a population: refused without --non-private, charged ε = ∞ with it
    Ledger(tmp_path / "ledger.sqlite3", create=True).close()
    with pytest.raises(PlanRefusedError, match="non-private"):
        charge(on_pop).open(None)
    c = charge(on_pop, non_private=True)
    c.open(None)
    c.reserve("run-ctrl", resumed=False, checkpoint_dir=tmp_path)
    row = c.ledger.charge("run-ctrl")
    assert row.population == "tickets-eu" and str(row.epsilon) == "Infinity" and row.status == "pending"
    c.ledger.close()
    # a DP run without population is charged as an unassigned run (never skipped like a control)
    from dplora.run.config import RunConfig

    def charged(contract):
        return RunConfig.charged.fget(
            SimpleNamespace(population=contract.privacy.population, private=contract.privacy.enabled)
        )

    assert charged(dp) and not charged(ctrl) and charged(on_pop)


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
