"""Attacks on how the unit key column is read wherever the data is read (functions take the contract's sections,
not the whole ``Contract``). Each test states a guarantee and FAILS if it no longer holds. No model is trained:
data checks are called directly, and the ranks' digests come from ``train._admit`` on a second rank with the
collectives stubbed.

Attacks:
  A1 eval_fraction split by unit: one side per unit, the keyed-hash rule, same split in budget/train/eval.
  A2 eval_path without (or with a blank) unit key column: read, never refused; no cell text in errors.
  A3 row-level eval_fraction: the unit id is the record's text (duplicates fall together).
  A4 public sample (clip-guide --public / sweep --eval-public): the unit key read only with ``units``; private
     files (data.path, a non-public eval_path, a symlink to either) refused.
  A6 ranks' input digests cover the unit key column (through train._admit).
The others live beside what they attack: A5 (resume) in tests/run/test_resume_unit_key_attacks.py, A7 (synth) in
tests/synth/test_verbatim_check_attacks.py, A8 (ledger) in tests/ledger/test_control_charge_attacks.py, A10
(budget) in tests/slow/data/test_unit_key_attacks.py.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.unit_key_attacks import SEED, unit_contract, write_csv

from dplora.data import public as public_data
from dplora.data import units as data_mod
from dplora.errors import BadInputError


@pytest.fixture
def tickets(tmp_path):
    rows = [f"u{i % 7},t{i % 13},question {i},answer {i},L{i % 2}" for i in range(80)]
    return write_csv(tmp_path / "data.csv", "user_id,ticket,message,reply,label", rows)


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

    contract = unit_contract(tmp_path, tickets, eval_fraction=0.4)
    admitted = rank1[0](contract)  # what `dplora train` splits
    train, held = admitted.table, admitted.held_out
    train_users, held_users = set(train["user_id"]), set(held["user_id"])
    assert train_users and held_users and not train_users & held_users  # a unit never straddles the split
    for user in train_users | held_users:  # the documented rule: held out iff the keyed hash is below the fraction
        assert (user in held_users) is data_mod.held_out_unit(user, SEED, 0.4)
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
    by_ticket = unit_contract(tmp_path, tickets, unit="ticket", key="ticket", eval_fraction=0.4)
    t_admitted = rank1[0](by_ticket)
    t_train, t_held = t_admitted.table, t_admitted.held_out
    assert not set(t_train["ticket"]) & set(t_held["ticket"])
    assert all((t in set(t_held["ticket"])) is data_mod.held_out_unit(t, SEED, 0.4) for t in set(t_train["ticket"]))


def test_a2_eval_path_without_or_with_blank_unit_key_is_read_not_refused(tmp_path, tickets, rank1):
    from dplora.evaluate.heldout import held_out_table
    from dplora.tuning import sweep

    no_key = write_csv(tmp_path / "held.csv", "message,reply,label", [f"eq{i},ea{i},L1" for i in range(6)])
    blank_key = write_csv(tmp_path / "held_blank.csv", "user_id,message,reply", [",eq,ea", "u1,eq2,ea2"])
    for path in (no_key, blank_key):
        contract = unit_contract(tmp_path, tickets, eval_path=path)
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
    bad = write_csv(tmp_path / "bad.csv", "user_id,message,reply", ["u1,SECRET-Q1,SECRET-A1", ",SECRET-Q2,SECRET-A2"])
    with pytest.raises(BadInputError, match="'user_id' has 1 empty cells") as err:
        _load(unit_contract(tmp_path, bad))
    assert "SECRET" not in str(err.value) and "u1" not in str(err.value)
    # and an eval file with an empty text cell is refused without showing any cell of it
    bad_eval = write_csv(tmp_path / "bad_eval.csv", "user_id,message,reply", ["SECRET-U,SECRET-Q,", "SECRET-U2,q,a"])
    with pytest.raises(BadInputError) as err:
        _split(unit_contract(tmp_path, tickets, eval_path=bad_eval))
    assert "SECRET" not in str(err.value)


def test_a3_row_level_split_keys_on_the_record_text(tmp_path):
    rows = [f"q{i % 30},a{i % 30}" for i in range(90)]  # every record three times
    path = write_csv(tmp_path / "rows.csv", "message,reply", rows)
    contract = unit_contract(tmp_path, path, unit="row", key=None, eval_fraction=0.3)
    train, held = _split(contract)
    pairs = lambda t: set(zip(t["message"], t["reply"], strict=True))  # noqa: E731
    assert pairs(train) and pairs(held) and not pairs(train) & pairs(held)  # identical records fall together
    for m, r in pairs(train) | pairs(held):
        assert ((m, r) in pairs(held)) is data_mod.held_out_unit(f"{m}\x1f{r}", SEED, 0.3)


def test_a4_public_sample_reads_the_unit_key_only_with_units_and_refuses_private_files(tmp_path, tickets):
    public = write_csv(tmp_path / "public.csv", "message,reply", [f"pq{i},pa{i}" for i in range(5)])
    non_public_eval = write_csv(tmp_path / "eval.csv", "message,reply", ["eq,ea"])
    contract = unit_contract(tmp_path, tickets, eval_path=non_public_eval)

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
    declared = unit_contract(tmp_path, tickets, eval_path=non_public_eval, eval_public=True)
    assert table(Path(non_public_eval), units=False, c=declared)[0].num_rows == 1  # declared public: allowed
    # the data section used to evaluate on a public table keeps label_column only where the table has it
    labelled = unit_contract(tmp_path, tickets, label_column="label", eval_fraction=0.2)
    assert public_data.eval_data(labelled.data, table(Path(public), units=False)[0]).label_column is None


def test_a6_ranks_input_digests_cover_the_unit_key_column(tmp_path, rank1):
    admit, seen = rank1
    rows = [f"u{i % 6},q{i},a{i}" for i in range(24)]
    a = write_csv(tmp_path / "a.csv", "user_id,message,reply", rows)
    # rank 1's own copy of data.path on another node: the same records, one user's key renamed (same grouping)
    b = write_csv(tmp_path / "b.csv", "user_id,message,reply", [r.replace("u0,", "u9,") for r in rows])
    for path in (a, b):
        admit(unit_contract(tmp_path, path))
    assert len(seen) == 2 and seen[0]["num_units"] == seen[1]["num_units"]
    assert seen[0]["data_sha256"] != seen[1]["data_sha256"]  # the unit key column is in the digest
