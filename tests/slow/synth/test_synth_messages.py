"""Issue 31: `dplora synth` writes conversations (the generated reply in the assistant turn) that `dplora train`
reads back under a messages contract; the manifest and `verify --synthetic` still hold; the verbatim check compares
conversations."""

from __future__ import annotations

import json

import pytest
from conftest import contract_dict, train_contract, write_contract
from tiny import CHATML, save_chat_model
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.contract.loader import load_contract
from dplora.synth.files import build_rows, memorisation_counts

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")
NO_PAIR = {"prompt_column": None, "response_column": None}


def _chats(path, n: int = 30):
    with open(path, "w") as fh:
        for i in range(n):
            turns = [{"role": "user", "content": f"order {i} is late"}, {"role": "assistant", "content": f"sorry {i}"}]
            fh.write(json.dumps({"customer": f"c{i % 11}", "conv": turns}) + "\n")
    return path


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory, signing_key):
    tmp = tmp_path_factory.mktemp("synthchat")
    model = save_chat_model(tmp / "model", CHATML)
    raw = contract_dict(
        model,
        _chats(tmp / "chats.jsonl"),
        tmp / "run",
        data={**NO_PAIR, "messages_column": "conv"},
        privacy={"protected_unit": "user", "unit_key": "customer"},
        training={"max_seq_len": 64},
    )
    assert train_contract(write_contract(tmp / "chat.yaml", raw), signing_key[0]).exit_code == 0
    prompts = tmp / "public.txt"
    prompts.write_text("My order has not arrived\nHow do I reset my password?\n")
    return tmp, model, tmp / "run", prompts


def _synth(run, out, prompts, key, *extra):
    args = ["synth", str(run), "--rows", "4", "--out", str(out), "--prompts", str(prompts), "--signing-key", str(key)]
    return runner.invoke(app, [*args, "--max-new-tokens", "6", "--seed", "3", "--threads", "1", *extra])


def test_synth_of_a_messages_run_writes_conversations_that_train_reads_back(chat_run, signing_key, tmp_path):
    tmp, model, run, prompts = chat_run
    out = tmp_path / "synthetic.jsonl"
    result = _synth(run, out, prompts, signing_key[0])  # no --format: follows the run's record format
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [list(r) for r in rows] == [["conv"]] * 4
    assert [[m["role"] for m in r["conv"]] for r in rows] == [["user", "assistant"]] * 4
    assert [r["conv"][0]["content"] for r in rows] == ["My order has not arrived", "How do I reset my password?"] * 2
    assert all(isinstance(r["conv"][1]["content"], str) for r in rows)
    manifest = json.loads(
        __import__("base64").b64decode(json.loads((tmp_path / "synthetic.jsonl.dsse.json").read_text())["payload"])
    )
    assert manifest["predicate"]["record_format"] == "messages" and manifest["predicate"]["columns"] == ["conv"]
    verified = runner.invoke(app, ["verify", str(run), "--public-key", str(signing_key[1]), "--synthetic", str(out)])
    assert verified.exit_code == 0, verified.output
    # the synthetic conversations train under a messages contract (row level: the file has no unit column)
    raw = contract_dict(model, out, tmp_path / "again", data={**NO_PAIR, "messages_column": "conv"})
    raw["privacy"]["num_units"] = 4
    raw["privacy"]["delta"] = 0.01
    raw["training"] |= {"expected_batch_size": 2, "max_seq_len": 64}
    assert train_contract(write_contract(tmp_path / "again.yaml", raw), signing_key[0]).exit_code == 0
    assert (tmp_path / "again" / "release.dsse.json").is_file()


def test_synth_format_messages_from_a_pair_run_and_refuses_csv(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    raw = contract_dict(tiny_model_dir, tickets_csv, tmp_path / "pair", training={"steps": 1})
    assert train_contract(write_contract(tmp_path / "pair.yaml", raw), signing_key[0]).exit_code == 0
    prompts = tmp_path / "p.txt"
    prompts.write_text("Where is my parcel?\n")
    refused = _synth(tmp_path / "pair", tmp_path / "s.csv", prompts, signing_key[0], "--format", "messages")
    assert refused.exit_code == 2 and "jsonl" in refused.output and not (tmp_path / "s.csv").exists()
    out = tmp_path / "s.jsonl"
    assert _synth(tmp_path / "pair", out, prompts, signing_key[0], "--format", "messages").exit_code == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [[m["role"] for m in r["messages"]] for r in rows] == [["user", "assistant"]] * 4
    assert {r["messages"][0]["content"] for r in rows} == {"Where is my parcel?"}


def test_the_verbatim_check_compares_conversations_and_assistant_turns(chat_run):
    tmp, *_ = chat_run
    contract = load_contract(tmp / "chat.yaml")
    rows = build_rows(
        contract.data,
        ["order 3 is late", "new prompt", "x"],
        ["sorry 3", "sorry 7", "fresh"],
        private=True,
        record_format="messages",
    )
    counts = memorisation_counts(rows, contract.data, log=lambda _m: None, unit_key=contract.privacy.unit_key)
    assert counts["flagged_rows"] == [0]  # the whole conversation equals training record 4
    assert counts["flagged_generated_rows"] == [0, 1]  # "sorry 7" is an assistant turn of the training data
    assert "sorry" not in json.dumps(counts)
