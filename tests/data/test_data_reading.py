"""Item 3 of issue 8: data read as written; unreadable files name the line and the likely cause, never the row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import contract_dict, contract_table

from dplora.contract.loader import parse_contract
from dplora.data.units import build_unit_index
from dplora.errors import BadInputError

WORDS = ["NaN", "NA", "null", "None", "nan", "NULL", "N/A", "#N/A", "n/a", "<NA>", "-nan", "1.#QNAN", "TRUE"]
SECRET = "Zanzibar-4471"  # stands for private text: must never appear in an error


def _contract(tmp_path: Path, data: Path, **privacy):
    raw = contract_dict(tmp_path / "model", data, tmp_path / "out", privacy=privacy)
    return parse_contract(raw)


def _load_error(tmp_path: Path, data: Path) -> str:
    with pytest.raises(BadInputError) as info:
        contract_table(_contract(tmp_path, data))
    message = str(info.value)
    assert SECRET not in message and "\n" not in message
    return message


def test_csv_words_that_look_missing_are_text(tmp_path):
    """Replies NaN, NA, null, None (and pandas' other NA spellings) are read as exactly that text."""
    lines = ["customer_id,message,reply"] + [f"00{i},question {i},{w}" for i, w in enumerate(WORDS)]
    data = tmp_path / "t.csv"
    data.write_text("\n".join(lines) + "\n")
    table = contract_table(_contract(tmp_path, data))
    assert table["reply"] == WORDS
    assert table["customer_id"][:2] == ["000", "001"]  # ids as written, not 0 and 1
    assert table.features["customer_id"].dtype == "string"


def test_unit_ids_are_compared_as_written(tmp_path):
    data = tmp_path / "t.csv"
    data.write_text("customer_id,message,reply\n7,a,b\n007,c,d\n7.0,e,f\n7,g,h\n")
    contract = _contract(tmp_path, data, protected_unit="user", unit_key="customer_id")
    index = build_unit_index(contract_table(contract), contract.privacy, seed=0)
    assert index.num_units == 3 and [len(r) for r in index.records_of_unit] == [2, 1, 1]


def test_only_a_truly_empty_cell_is_empty(tmp_path):
    data = tmp_path / "t.csv"
    data.write_text('customer_id,message,reply\n1,a,NaN\n2,b,""\n3,c,\n')
    assert "column 'reply' has 2 empty cells (data rows 2, 3)" in _load_error(tmp_path, data)


def test_jsonl_string_null_is_text_and_json_null_is_empty(tmp_path):
    data = tmp_path / "t.jsonl"
    rows = [{"message": "a", "reply": w} for w in ("NaN", "null", "None", "NA")]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert contract_table(_contract(tmp_path, data))["reply"] == ["NaN", "null", "None", "NA"]
    data.write_text(json.dumps({"message": "a", "reply": "x"}) + "\n" + json.dumps({"message": "b", "reply": None}))
    assert "column 'reply' has 1 empty cells (data rows 2)" in _load_error(tmp_path, data)


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        (
            "ragged.csv",
            f"id,message,reply\n1,a,b\n2,{SECRET},b,extra\n".encode(),
            "line 3 has 4 fields but the header has 3 (likely a comma inside a cell that is not quoted)",
        ),
        ("short.csv", f"id,message,reply\n1,{SECRET}\n2,a,b\n".encode(), "line 2 has 2 fields but the header has 3"),
        (
            "quote.csv",
            f'id,message,reply\n1,"{SECRET},b\n2,a,b\n'.encode(),
            "the record on lines 2-3 has 2 fields but the header has 3 (likely an unbalanced quote)",
        ),
        (
            "latin1.csv",
            f"id,message,reply\n1,a,b\n2,caf\u00e9 {SECRET},b\n".encode("latin-1"),
            "line 3 is not UTF-8 (byte 6 of the line); the file is likely Latin-1 or Windows-1252",
        ),
        ("dup.csv", b"id,reply,message,reply\n1,a,b,c\n", "column 'reply' appears twice in the header (line 1)"),
        (
            "bad.jsonl",
            f'{{"message": "a", "reply": "b"}}\n{{"message": "{SECRET}", reply: "b"}}\n'.encode(),
            "line 2 is not valid JSON (Expecting property name enclosed in double quotes at column",
        ),
        (
            "list.jsonl",
            f'{{"message": "a", "reply": "b"}}\n["{SECRET}", "b"]\n'.encode(),
            "line 2 is not a JSON object",
        ),
        (
            "latin1.jsonl",
            f'{{"message": "caf\u00e9 {SECRET}", "reply": "b"}}\n'.encode("latin-1"),
            "line 1 is not UTF-8",
        ),
    ],
)
def test_unreadable_files_name_the_line_and_the_cause(tmp_path, name, content, expected):
    data = tmp_path / name
    data.write_bytes(content)
    message = _load_error(tmp_path, data)
    assert message.startswith(f"data file {data}: ") and expected in message, message
    assert "DatasetGenerationError" not in message


def test_a_folder_as_data_path_is_not_called_missing(tmp_path):
    folder = tmp_path / "tickets"
    folder.mkdir()
    message = _load_error(tmp_path, folder)
    assert "is a folder" in message and "not found" not in message
