"""Issue 42.6: ``dplora validate --check-files`` checks the model (config.json, weights, tokenizer, chat template)
and the data file (columns from its header or schema, the conversation shape) without importing torch, printing
no value computed from the records (issue 49); ``train`` checks the model folder before it reads the data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.check_files import SECRET, shared_cfg, validate


@pytest.fixture
def data_csv(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text(f"message,reply\n{SECRET} hello,{SECRET} reply\n")
    return path


def test_json_lists_the_checks(tmp_path, tiny_model_dir, data_csv):
    result = validate(shared_cfg(tmp_path, tiny_model_dir, data_csv), "--json")
    doc = json.loads(result.output)
    assert doc["ok"] is True and len(doc["files"]) == 2 and doc["files"][1].startswith("OK  data.path: ")


def _broken_tokenizer(folder: Path) -> Path:
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    return folder


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        ("no folder", "model not found: model.path="),
        ("no config", "has no config.json: not a Hugging Face model folder"),
        ("bad tokenizer", "tokenizer.json cannot be read ("),
        ("no weights", "has no weight files (*.safetensors or pytorch_model*.bin)"),
        ("not gguf", "does not start with the GGUF magic bytes: not GGUF"),
    ],
)
def test_model_problems_are_one_line_exit_2(tmp_path, tiny_model_dir, data_csv, breakage, expected):
    import shutil

    model = tmp_path / "model"
    if breakage != "no folder":
        shutil.copytree(tiny_model_dir, model)
    if breakage == "no config":
        (model / "config.json").unlink()
    if breakage == "bad tokenizer":
        _broken_tokenizer(model)
    if breakage == "no weights":
        for f in model.glob("*.safetensors"):
            f.unlink()
    if breakage == "not gguf":
        model = tmp_path / "m.gguf"
        model.write_bytes(b"PK\x03\x04 not a gguf")
    result = validate(shared_cfg(tmp_path, model, data_csv))
    assert result.exit_code == 2
    assert expected in result.output and result.output.count("\n") == 1


def test_data_problems_name_the_column_never_a_value(tmp_path, tiny_model_dir, data_csv):
    result = validate(shared_cfg(tmp_path, tiny_model_dir, data_csv, data={"response_column": "answer"}))
    assert result.exit_code == 2
    assert result.output == f"error: data.path: {data_csv} has no column 'answer'; columns are: message, reply\n"
    missing = validate(shared_cfg(tmp_path, tiny_model_dir, tmp_path / "nope.csv"))
    assert missing.exit_code == 2 and "data file not found: data.path=" in missing.output


def test_a_byte_order_mark_is_fine_and_names_are_kept_as_written(tmp_path, tiny_model_dir):
    data = tmp_path / "bom.csv"
    data.write_bytes("\ufeffmessage, reply\nhi,there\n".encode())
    result = validate(shared_cfg(tmp_path, tiny_model_dir, data))
    assert result.exit_code == 2  # " reply" (with its space) is not "reply", as train reads the header
    assert result.output == f"error: data.path: {data} has no column 'reply'; columns are: message,  reply\n"
