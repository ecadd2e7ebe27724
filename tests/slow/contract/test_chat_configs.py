"""The slow tier of tests/contract/test_chat_configs.py, whose docstring describes the module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import release_statement
from tiny import CHATML, save_chat_model
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.contract.loader import load_contract

ROOT = Path(__file__).resolve().parents[3]


runner = CliRunner()


pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


def _demo_chat(tmp_path: Path) -> Path:
    path = tmp_path / "tickets_chat.jsonl"
    result = runner.invoke(app, ["demo-data", str(path), "--format", "messages", "--tickets", "40", "--seed", "1"])
    assert result.exit_code == 0, result.output
    return path


def _twcs_chat(tmp_path: Path) -> Path:
    path = tmp_path / "twcs_conversations.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(30):
            turns = [
                {"role": "user", "content": f"@Brand order {i} late"},
                {"role": "assistant", "content": "@c sorry"},
            ]
            fh.write(json.dumps({"customer_id": str(100 + i % 20), "tweet_id": str(i), "messages": turns}) + "\n")
    return path


@pytest.mark.parametrize(
    ("name", "data", "n"), [("demo_chat", _demo_chat, 330), ("twcs_conversations", _twcs_chat, 1197)]
)
def test_a_chat_config_plans_on_tiny_data_of_its_format(name, data, n, tmp_path):
    path = data(tmp_path)
    contract = load_contract(ROOT / "configs" / f"{name}.yaml", [f"data.path={path}"])
    assert contract.data.kind == "messages" and contract.privacy.protected_unit == "user"
    assert contract.data.messages_key == "messages" and contract.privacy.unit_key == "customer_id"
    result = runner.invoke(app, ["budget", str(ROOT / "configs" / f"{name}.yaml"), f"data.path={path}", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["ok"] is True and 0 < plan["epsilon"] <= 8.0 and plan["protected_unit"] == "user"
    assert (plan["num_units"], plan["num_units_source"], plan["steps"]) == (n, "contract", 20)


def test_demo_chat_trains_on_the_tiny_chat_model(tmp_path, signing_key):
    model = save_chat_model(tmp_path / "model", CHATML)
    args = [f"data.path={_demo_chat(tmp_path)}", f"training.output_dir={tmp_path / 'run'}", "training.steps=2"]
    args += ["model.name=null", f"model.path={model}", "training.max_seq_len=96", "privacy.noise_multiplier=1.0"]
    result = runner.invoke(
        app,
        [
            "train",
            str(ROOT / "configs" / "demo_chat.yaml"),
            *args,
            "--signing-key",
            str(signing_key[0]),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    tokenization = release_statement(tmp_path / "run")["predicate"]["tokenization"]
    assert tokenization["record_format"] == "messages" and tokenization["chat_template"] == "model"
