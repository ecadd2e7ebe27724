"""The slow tier of tests/mechanism/test_sampling.py, whose docstring describes the module."""

from __future__ import annotations

import pytest

from dplora.contract.loader import parse_contract


def _jsonl_units(tmp_path, name, rows, **data):
    """(each unit's kept messages, held-out unit ids, training texts) of a user-level jsonl file, cap 2."""
    import json

    from conftest import contract_dict

    from dplora.data import units as data_mod

    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = contract_dict(tmp_path / "no-model", path, tmp_path / "out")
    raw["privacy"].update(protected_unit="user", unit_key="user", max_records_per_unit=2)
    raw["data"].update(data)
    contract = parse_contract(raw)
    table = data_mod.load_table(contract.data, unit_key="user")
    table, held = data_mod.split_eval(table, contract.data, unit_key="user", seed=0)
    index = data_mod.build_unit_index(table, contract.privacy, seed=0)
    kept = {table["user"][int(g[0])]: sorted(table["message"][int(i)] for i in g) for g in index.records_of_unit}
    texts = dict(zip(table["message"], table["reply"], strict=True))
    return kept, (set(held["user"]) if held is not None else set()), texts


@pytest.mark.parametrize(
    "extra",
    [
        {"user": 99, "message": "x", "reply": "y", "score": 0, "note": "a key no other record has"},
        {"user": 99, "message": "x", "reply": "y", "score": 0.5},  # one decimal makes the column float
        {"user": 99.5, "message": "x", "reply": "y", "score": 0},  # a decimal id makes every id float
        {"user": 99, "message": "x", "reply": 2.5, "score": 0},  # numeric replies: 2 would read as 2.0
    ],
)
def test_jsonl_types_of_one_unit_move_no_other_unit(tmp_path, extra):
    """Red-team case: jsonl/parquet columns take one type for the whole file, so one added unit's extra key or
    decimal changed every other unit's kept records (record digest over typed cells), ids ("1" → "1.0": other
    held-out units) and training text ("2" → "2.0"). Cells are now text by their own value (data.cell_text)."""
    rows = [{"user": u, "message": f"m{u}-{i}", "reply": i * 2, "score": i} for u in range(1, 41) for i in range(5)]
    a, held_a, texts_a = _jsonl_units(tmp_path, "d", rows, eval_fraction=0.3)
    b, held_b, texts_b = _jsonl_units(tmp_path, "d2", [*rows, extra], eval_fraction=0.3)
    new = {str(extra["user"]) if not float(extra["user"]).is_integer() else str(int(extra["user"]))}
    assert held_b - new == held_a and held_a  # the held-out split of every other unit is unchanged
    assert {u: k for u, k in b.items() if u not in new} == a  # every other unit keeps the same records
    assert {m: t for m, t in texts_b.items() if m != "x"} == texts_a  # and trains on the same text
    assert texts_a["m1-1"] == "2"
