"""The slow tier of tests/cli/test_check_files.py, whose docstring describes the module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.check_files import SECRET, shared_cfg, validate
from tiny import save_chat_model
from typer.testing import CliRunner

from dplora.cli.app import app

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def data_csv(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text(f"message,reply\n{SECRET} hello,{SECRET} reply\n")
    return path


def test_ok_lines_name_the_model_and_the_columns(tmp_path, tiny_model_dir, data_csv):
    result = validate(shared_cfg(tmp_path, tiny_model_dir, data_csv))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"OK: contract {tmp_path / 'c.yaml'} is valid (sha256 ")
    assert (
        lines[1]
        == f"OK  model: {tiny_model_dir} (model_type llama; 1 weight file(s); tokenizer.json; no chat template)"
    )
    assert lines[2] == f"OK  data.path: {data_csv} (csv; columns message, reply present)"
    assert SECRET not in result.output
    plain = CliRunner().invoke(app, ["validate", str(tmp_path / "c.yaml")])
    assert plain.output.rstrip().endswith("; files not checked (--check-files)")


def test_conversation_shape_from_the_first_record(tmp_path):
    model = save_chat_model(tmp_path / "chat-model")
    good = tmp_path / "chat.jsonl"
    turns = [{"role": "user", "content": SECRET}, {"role": "assistant", "content": SECRET}]
    good.write_text(json.dumps({"customer_id": "c1", "messages": turns}) + "\n")
    data = {"prompt_column": None, "response_column": None, "record_format": "messages"}
    privacy = {"protected_unit": "user", "unit_key": "customer_id"}
    result = validate(shared_cfg(tmp_path, model, good, data=data, privacy=privacy))
    assert result.exit_code == 0, result.output
    assert "a chat template)" in result.output
    assert f"OK  data.path: {good} (jsonl; columns messages, customer_id present); messages holds lists of" in (
        result.output
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"customer_id": "c1", "messages": SECRET}) + "\n")  # text, not a list of turns
    refused = validate(shared_cfg(tmp_path, model, bad, data=data, privacy=privacy))
    assert refused.exit_code == 2
    assert "column 'messages', data row 1: a conversation must be a non-empty list of messages" in (refused.output)
    assert SECRET not in refused.output and SECRET not in result.output


def test_check_files_imports_no_torch(tmp_path, tiny_model_dir, data_csv):
    cfg = shared_cfg(tmp_path, tiny_model_dir, data_csv)
    code = (
        "import sys\nfrom dplora.cli.app import app\n"
        f"code = app(['validate', {str(cfg)!r}, '--check-files'], standalone_mode=False)\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'datasets', 'opacus', 'peft') if m in sys.modules)\n"
        "print('heavy:', heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT)}
    )
    assert done.returncode == 0, done.stderr
    assert "OK  data.path:" in done.stdout and "heavy: []" in done.stdout


def test_train_checks_the_model_before_reading_the_data(tmp_path, signing_key):
    cfg = shared_cfg(tmp_path, tmp_path / "no-model", tmp_path / "no-data.csv")
    result = CliRunner().invoke(app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"])
    assert result.exit_code == 2
    assert "model not found: model.path=" in result.output and "data file not found" not in result.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
