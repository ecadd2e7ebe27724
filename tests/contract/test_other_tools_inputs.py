"""Inputs written for other tools: ShareGPT with ``from: user/assistant/system``, OpenAI-style content parts, a
``.json`` array for ``init``, an axolotl config named key by key (never cut), and CLI options read by meaning."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import contract_dict, write_contract
from tiny import save_chat_model
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.data.chat import check_messages
from dplora.data.readers import read_table
from dplora.errors import BadInputError

WANT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hi there"},
    {"role": "assistant", "content": "hello"},
]


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_sharegpt_with_role_names_in_from():
    turns = [{"from": "system", "value": "Be brief."}, {"from": "user", "value": "hi there"}]
    turns.append({"from": "assistant", "value": "hello"})
    assert check_messages(turns, 1, "conversations") == WANT
    human = [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "hi there"}]
    assert check_messages([*human, {"from": "gpt", "value": "hello"}], 1, "conversations") == WANT


def test_sharegpt_values_may_be_content_parts_too():
    turns = [
        {"from": "system", "value": [{"type": "text", "text": "Be brief."}]},
        {"from": "user", "value": "hi there"},
    ]
    assert check_messages([*turns, {"from": "gpt", "value": "hello"}], 1, "conversations") == WANT


@pytest.mark.parametrize(
    ("name", "column", "turns", "shape"),
    [
        ("sharegpt.jsonl", "conversations", [{"from": "user", "value": "hi"}, {"from": "assistant", "value": "ok"}],
         "conversations holds lists of ShareGPT {from, value}"),
        ("parts.json", "messages", [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                                    {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}],
         "messages holds lists of {role, content}"),
    ],
)  # fmt: skip
def test_check_files_reads_other_tools_conversations_and_names_their_shape(tmp_path, name, column, turns, shape):
    """`validate --check-files` on a ShareGPT jsonl (from: user/assistant) and a .json array of OpenAI content parts:
    the first record is read and its shape named."""
    path = tmp_path / name
    rows = [{column: turns} for _ in range(3)]
    path.write_text(json.dumps(rows) if name.endswith(".json") else "".join(json.dumps(r) + "\n" for r in rows))
    model = save_chat_model(tmp_path / "model")
    data = {"prompt_column": None, "response_column": None, "messages_column": column}
    cfg = write_contract(tmp_path / "c.yaml", contract_dict(model, path, tmp_path / "out", data=data))
    result = run("validate", cfg, "--check-files")
    assert result.exit_code == 0, result.output
    assert f"OK  data.path: {path} ({name.rsplit('.', 1)[1]}; columns {column} present); {shape}" in result.output


def test_openai_content_parts_are_joined_text():
    parts = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "hello"},
    ]
    assert check_messages(parts, 1, "messages") == WANT
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(BadInputError, match=r"data row 3: message 1 has a content part that is not text \('image_url'"):
        check_messages(image, 3, "messages")


def test_a_json_array_file_with_parts_is_read_and_init_writes_its_contract(tmp_path):
    system = WANT[0] | {"content": [{"type": "text", "text": "s"}]}
    rows = [{"user_id": f"u{i}", "messages": [system, *WANT[1:]]} for i in range(3)]
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(rows))  # one JSON array, as OpenAI/HF exports write it
    table = read_table(path, "json")
    assert [check_messages(v, i, "messages")[1:] for i, v in enumerate(table["messages"], 1)] == [WANT[1:]] * 3
    result = run("init", path, "smollm2-135m", "--out", tmp_path / "c.yaml")
    assert result.exit_code == 0, result.output
    data = yaml.safe_load((tmp_path / "c.yaml").read_text())["data"]
    assert data["path"] == str(path) and data["messages_column"] == "messages"

    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(
        json.dumps([{"conversations": [{"from": "user", "value": "a"}, {"from": "gpt", "value": "b"}]}])
    )
    result = run("init", sharegpt, "smollm2-135m", "--out", tmp_path / "s.yaml")
    assert result.exit_code == 0 and "ShareGPT" in result.output, result.output


AXOLOTL = {
    "base_model": "NousResearch/Llama-2-7b-hf",
    "model_type": "LlamaForCausalLM",
    "tokenizer_type": "LlamaTokenizer",
    "load_in_8bit": False,
    "load_in_4bit": True,
    "strict": False,
    "datasets": [{"path": "mhenrichsen/alpaca_2k_test", "type": "alpaca"}],
    "dataset_prepared_path": "last_run_prepared",
    "val_set_size": 0.05,
    "output_dir": "./outputs/qlora-out",
    "adapter": "qlora",
    "lora_r": 32,
    "lora_alpha": 16,
    "lora_dropout": 0.05,
    "lora_target_modules": ["q_proj", "v_proj"],
    "sequence_len": 4096,
    "sample_packing": True,
    "micro_batch_size": 2,
    "gradient_accumulation_steps": 4,
    "num_epochs": 4,
    "optimizer": "paged_adamw_32bit",
    "lr_scheduler": "cosine",
    "learning_rate": 0.0002,
    "warmup_steps": 10,
    "train_on_inputs": False,
}


def test_an_axolotl_config_names_every_key_grouped_and_uncut(tmp_path):
    assert len(AXOLOTL) == 25
    path = tmp_path / "axolotl.yaml"
    path.write_text(yaml.safe_dump(AXOLOTL, sort_keys=False))
    result = run("validate", path)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: contract: 25 unknown keys"), lines
    line = lines[0]
    assert not line.endswith("...") and len(line) > 600
    no_key = line.split("no dplora key: ", 1)[1].split(";", 1)[0].split(", ")
    for key in AXOLOTL:  # every key named once: with the dplora key it stands for, or among those without one
        assert (f"{key} → " in line) != (key in no_key), key
    assert no_key == ["model_type", "tokenizer_type", "strict", "dataset_prepared_path", "sample_packing"]
    for theirs, ours in [
        ("base_model", "model.path"),
        ("learning_rate", "training.lr"),
        ("lora_r", "lora.r"),
        ("micro_batch_size", "training.physical_batch_size"),
        ("output_dir", "training.output_dir"),
        ("warmup_steps", "training.warmup_steps"),
        ("datasets", "data.path"),
        ("adapter", "model.quantization"),
        ("lr_scheduler", "training.lr_schedule"),
        ("train_on_inputs", "data.train_on"),
    ]:
        assert f"{theirs} → {ours}" in line, theirs
    assert line.index("dplora calls them:") < line.index("nearest dplora keys:") < line.index("no dplora key:")


def test_a_trl_config_gets_the_dplora_key_for_each_known_name(tmp_path):
    """TRL's SFTConfig names by meaning; the HF Trainer's max_grad_norm keeps its batch-versus-unit note."""
    trl = {
        "model_name_or_path": "Qwen/Qwen2-0.5B",
        "dataset_name": "trl-lib/Capybara",
        "learning_rate": 2e-5,
        "assistant_only_loss": True,
        "completion_only_loss": True,
        "max_grad_norm": 1.0,
        "packing": False,
        "seed": 42,
    }
    path = tmp_path / "trl.yaml"
    path.write_text(yaml.safe_dump(trl, sort_keys=False))
    result = run("validate", path)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: contract: 8 unknown keys"), lines
    for theirs, ours in [
        ("model_name_or_path", "model.path"),
        ("dataset_name", "data.path"),
        ("assistant_only_loss", "data.train_on"),
        ("completion_only_loss", "data.response_column"),
        ("seed", "training.seed"),
    ]:
        assert f"{theirs} → {ours}" in lines[0], theirs
    assert "max_grad_norm → privacy.max_grad_norm (the HF Trainer's max_grad_norm clips the whole batch" in lines[0]
    assert lines[0].split("no dplora key: ", 1)[1].startswith("packing;")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train", "--config", "c.yaml"], "the contract is the first argument: dplora train CONTRACT.yaml"),
        (["budget", "x.yaml", "--config", "c.yaml"], "the contract is the first argument: dplora budget CONTRACT.yaml"),
        (
            ["train", "x.yaml", "--lr", "1e-3"],
            "use the override training.lr=…: dplora train CONTRACT.yaml training.lr=…",
        ),
        (["train", "x.yaml", "--learning-rate", "1e-3"], "use the override training.lr=…"),
        (["budget", "x.yaml", "--epsilon", "4"], "use the override privacy.target_epsilon=…"),
        (["eval", "--run", "r"], "the run folder (or its contract) is the first argument: dplora eval RUN"),
        (["train", "x.yaml", "--model", "m"], "use the override model.path=…: dplora train CONTRACT.yaml model.path=…"),
        (
            ["train", "x.yaml", "--data", "d.csv"],
            "use the override data.path=…: dplora train CONTRACT.yaml data.path=…",
        ),
        (["train", "x.yaml", "--out", "o"], "use the override training.output_dir=…"),
        (["eval", "r", "--lr", "1e-3"], "training.lr is a contract key, set when training: dplora train CONTRACT.yaml"),
        (["generate", "r", "--max-seq-len", "9"], "training.max_seq_len is a contract key, set when training"),
        (["train", "x.yaml", "--overwite"], "did you mean --overwrite?"),
    ],
)
def test_option_suggestions_prefer_meaning_over_spelling(args, expected):
    result = run(*args)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert "--ledger" not in lines[0] and "--json" not in lines[0] and "--data-key" not in lines[0]
    assert "--model?" not in lines[0] and "--max-new-tokens" not in lines[0]
