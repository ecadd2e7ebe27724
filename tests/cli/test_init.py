"""Issue 42.4: ``dplora init DATA MODEL`` writes a commented contract from the data file's structure only; N, ε and δ
are left for the user (the file fails validation with one line naming all of them); every missing key at once."""

from __future__ import annotations

import json

import pytest
from support.init import filled, run

from dplora.contract.loader import parse_contract
from dplora.errors import BadInputError


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


TURN = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


SHAPES = [
    ("chat.jsonl", [{"customer_id": "c1", "messages": TURN}], {"messages_column": "messages"}, "user"),
    (
        "sharegpt.jsonl",
        [{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}],
        {"messages_column": "conversations"},
        "row",
    ),
    (
        "trl_conv.jsonl",
        [{"user_id": "u", "prompt": TURN[:1], "completion": TURN[1:]}],
        {"messages_column": "prompt", "completion_column": "completion"},
        "user",
    ),
    (
        "trl.jsonl",
        [{"prompt": "hi", "completion": "yo"}],
        {"prompt_column": "prompt", "response_column": "completion"},
        "row",
    ),
    (
        "alpaca.jsonl",
        [{"instruction": "hi", "input": "", "output": "yo"}],
        {"prompt_column": "instruction", "response_column": "output"},
        "row",
    ),
    ("lm.jsonl", [{"text": "hello world", "ticket_id": "t"}], {"text_column": "text"}, "ticket"),
]


@pytest.mark.parametrize(("name", "rows", "keys", "unit"), SHAPES, ids=[s[0] for s in SHAPES])
def test_init_writes_a_contract_that_fails_until_n_eps_delta_are_declared(
    tmp_path, monkeypatch, name, rows, keys, unit
):
    monkeypatch.chdir(tmp_path)
    data = _jsonl(tmp_path / name, rows)
    res = run("init", data, "smollm2-135m", "--out", "c.yaml")
    assert res.exit_code == 0, res.output
    res = run("validate", "c.yaml")
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert lines == [
        "error: contract: declare privacy.target_epsilon, privacy.delta, privacy.num_units (written as DECLARE: the "
        "comments beside them say why dplora cannot fill them)"
    ]
    contract = filled(tmp_path / "c.yaml")
    d = contract.data
    got = {
        k: getattr(d, k)
        for k in ("text_column", "prompt_column", "response_column", "messages_column", "completion_column")
        if getattr(d, k) is not None
    }
    assert got == keys
    assert contract.privacy.protected_unit.value == unit
    assert (contract.privacy.num_units, contract.privacy.target_epsilon, contract.privacy.delta) == (200, 8.0, 1e-5)
    assert contract.training.expected_batch_size == "auto" and contract.model.name == "smollm2-135m"
    assert run("validate", "c.yaml").exit_code == 0


def test_init_reads_structure_only_neighbouring_files_give_identical_contracts(tmp_path):
    """Removing a unit's records, or changing every value and length, changes nothing in the contract."""
    rows = [{"customer_id": f"c{i}", "messages": TURN * (i % 3 + 1)} for i in range(30)]
    a = _jsonl(tmp_path / "a" / "chat.jsonl", rows) if (tmp_path / "a").mkdir() is None else None
    b = _jsonl(tmp_path / "b" / "chat.jsonl", rows[1:]) if (tmp_path / "b").mkdir() is None else None
    other = [{"customer_id": "zz" * 40, "messages": [{"role": "user", "content": "x" * 999}]}]
    c = _jsonl(tmp_path / "c" / "chat.jsonl", other) if (tmp_path / "c").mkdir() is None else None
    texts = []
    for path in (a, b, c):
        assert run("init", path, "smollm2-135m", "--out", path.parent / "c.yaml").exit_code == 0
        texts.append((path.parent / "c.yaml").read_text().replace(str(path.parent), "DIR"))
    assert texts[0] == texts[1] == texts[2]


def _init_text(tmp_path, name: str, rows: list[dict]) -> str:
    """The contract ``init`` writes for ``rows`` saved as ``<name>/data.jsonl``, its folder written as DIR."""
    (tmp_path / name).mkdir()
    path = _jsonl(tmp_path / name / "data.jsonl", rows)
    res = run("init", path, "smollm2-135m", "--out", path.parent / "c.yaml")
    assert res.exit_code == 0, res.output
    return (path.parent / "c.yaml").read_text().replace(str(path.parent), "DIR")


def test_init_reads_the_keys_every_record_has_so_one_units_extra_key_changes_nothing(tmp_path):
    """One unit's record carries a key the others lack (a customer id, a system field): the contract is built from
    the keys every record has, so D (with that unit, first in the file) and D' (without it) get the same contract,
    ticket-level on ticket_id; the first record alone made D's user-level on customer_id."""
    extra = {"ticket_id": "t0", "customer_id": "c0", "system": "s", "prompt": "p", "completion": "c"}
    rows = [{"ticket_id": f"t{i}", "prompt": "p", "completion": "c"} for i in range(1, 6)]
    d = _init_text(tmp_path, "d", [extra, *rows])
    d_prime = _init_text(tmp_path, "d-prime", rows)
    assert d == d_prime
    assert "  protected_unit: ticket " in d and '  unit_key: "ticket_id" ' in d and "customer_id" not in d
    assert '  prompt_column: "prompt" ' in d and '  response_column: "completion" ' in d


def test_init_residual_one_unit_lacking_a_shared_key_changes_the_contract(tmp_path):
    """The documented residual: when the removed unit is the only one lacking a key all others have (here
    customer_id), the keys every record has differ between D and D', and so does the contract (ticket-level with it,
    user-level without it). A key no one else lacks is a column of the others' schema; init names it only when all
    records have it. The contract is reviewed by the operator before commit."""
    rows = [{"customer_id": f"c{i}", "ticket_id": f"t{i}", "text": "x"} for i in range(5)]
    lacking = {"ticket_id": "t9", "text": "x"}
    d = _init_text(tmp_path, "d", [*rows, lacking])
    d_prime = _init_text(tmp_path, "d-prime", rows)
    assert "  protected_unit: ticket " in d and '  unit_key: "ticket_id" ' in d and "customer_id" not in d
    assert "  protected_unit: user " in d_prime and '  unit_key: "customer_id" ' in d_prime


def test_init_turn_keys_and_types_come_from_every_record(tmp_path):
    """A list column's object keys are those every object has; a null value counts as a missing key; a key whose
    JSON type differs between records is neither text nor a list (the data reader refuses such a file)."""
    from dplora.contract.shape import read_structure

    rows = [
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo", "weight": 1}], "n": 1},
        {"conversations": [{"from": "human", "value": "hi", "name": "x"}], "n": "one", "note": None},
        {"conversations": [], "note": "a"},
    ]
    structure = read_structure(_jsonl(tmp_path / "s.jsonl", rows), every_record=True)
    assert structure.columns == {"conversations": "list"}
    assert structure.turn_keys == {"conversations": ("from", "value")}
    two = read_structure(_jsonl(tmp_path / "t.jsonl", rows[:2]), every_record=True)
    assert two.columns == {"conversations": "list", "n": "other"}
    first = read_structure(tmp_path / "s.jsonl")  # record_format: auto still reads the first record only
    assert first.columns == {"conversations": "list", "n": "other"}
    assert first.turn_keys == {"conversations": ("from", "value")}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\nnot json\n')
    res = run("init", bad, "smollm2-135m", "--out", tmp_path / "bad.yaml")
    assert res.exit_code == 2 and "cannot read the columns of" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize(("name", "rows", "keys", "unit"), SHAPES, ids=[s[0] for s in SHAPES])
def test_init_always_names_the_column_keys(tmp_path, name, rows, keys, unit):
    """init's contract never leaves the shape to detection at load time: its record_format is not auto and it
    names every column key of the shape (messages_column: messages too)."""
    import yaml

    text = _init_text(tmp_path, "x", rows)
    data = yaml.safe_load(text)["data"]
    assert data["record_format"] != "auto"
    assert {k: v for k, v in data.items() if k.endswith("_column")} == keys


def test_init_model_forms_and_bad_inputs(tmp_path, tiny_model_dir):
    data = _jsonl(tmp_path / "pc.jsonl", [{"prompt": "p", "completion": "c"}])
    assert run("init", data, tiny_model_dir, "--out", tmp_path / "a.yaml").exit_code == 0
    assert f'path: "{tiny_model_dir}"' in (tmp_path / "a.yaml").read_text()
    assert run("init", data, "Org/Model-1", "--out", tmp_path / "b.yaml").exit_code == 0
    assert "  name: Org/Model-1 " in (tmp_path / "b.yaml").read_text()
    res = run("init", data, "smollm2-135m", "--out", tmp_path / "a.yaml")
    assert res.exit_code == 2 and "exists; pass --overwrite" in res.output
    res = run("init", data, "no-such-model", "--out", tmp_path / "c.yaml")
    assert res.exit_code == 2 and "MODEL='no-such-model'" in res.output and not (tmp_path / "c.yaml").exists()
    odd = _jsonl(tmp_path / "odd.jsonl", [{"question_text": "private words", "n": 1}])
    res = run("init", odd, "smollm2-135m", "--out", tmp_path / "d.yaml")
    assert res.exit_code == 2 and "cannot tell the record shape from the columns ('n', 'question_text')" in res.output
    assert "private" not in res.output and "Traceback" not in res.output
    res = run("init", tmp_path / "missing.csv", "smollm2-135m", "--out", tmp_path / "e.yaml")
    assert res.exit_code == 2 and "data file not found" in res.output


def test_every_missing_key_is_named_at_once():
    raw = {
        "privacy": {"protected_unit": "row", "target_epsilon": 3.0, "delta": 1e-5},
        "model": {"name": "smollm2-135m"},
        "data": {"path": "x.csv"},
        "training": {"steps": 3},
    }
    with pytest.raises(BadInputError) as err:
        parse_contract(raw)
    assert str(err.value) == (
        "contract: missing keys 'privacy.adjacency', 'privacy.max_grad_norm', 'training.expected_batch_size'; "
        "every key: docs/contract.md"
    )
    raw["privacy"] |= {"adjacency": "add_remove", "max_grad_norm": 1.0, "num_units": "DECLARE"}
    raw["training"]["expected_batch_size"] = 8
    with pytest.raises(BadInputError, match=r"^contract: declare privacy.num_units \(written as DECLARE"):
        parse_contract(raw)
    raw["privacy"]["num_units"] = 100
    assert parse_contract(raw).privacy.num_units == 100
