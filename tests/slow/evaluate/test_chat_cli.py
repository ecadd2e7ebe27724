"""Issue 28 end to end: a conversations contract trains, verifies and evaluates through the chat template on the
tiny model (ChatML template attached); the record and card carry the template's sha256; `--resume` refuses a
template change."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
from conftest import contract_dict, release_statement, write_contract
from tiny import CHATML, save_chat_model
from typer.testing import CliRunner

from dplora.cli.app import app

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")
NO_PAIR = {"prompt_column": None, "response_column": None}


def _conversations(path, n: int = 40):
    rng = random.Random(3)
    with open(path, "w") as fh:
        for i in range(n):
            turns = [{"role": "system", "content": "be kind"}]  # not the template's 83-token default
            turns.append({"role": "user", "content": f"order {i} is late {'!' * rng.randint(0, 30)}"})
            turns.append({"role": "assistant", "content": f"sorry, order {i} is on its way"})
            if i % 3 == 0:
                turns += [{"role": "user", "content": "thanks"}, {"role": "assistant", "content": "welcome " * 20}]
            fh.write(json.dumps({"customer": f"c{i % 17}", "messages": turns}) + "\n")
    return path


@pytest.fixture(scope="module")
def chat_setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chat")
    return tmp, save_chat_model(tmp / "model", CHATML), _conversations(tmp / "chats.jsonl")


def test_a_conversations_contract_trains_verifies_and_evaluates(chat_setup, signing_key):
    tmp, model, data = chat_setup
    raw = contract_dict(
        model,
        data,
        tmp / "run",
        data={**NO_PAIR, "eval_fraction": 0.25},
        privacy={"protected_unit": "user", "unit_key": "customer"},
        training={"max_seq_len": 96},
    )
    cfg = write_contract(tmp / "chat.yaml", raw)
    result = runner.invoke(app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"])
    assert result.exit_code == 0, result.output
    out = tmp / "run"
    private = (tmp / "run.private" / "train.log").read_text()  # private counts: never on the public log
    assert "truncated to training.max_seq_len=96" in private and "truncated" not in result.output
    tokenization = release_statement(out)["predicate"]["tokenization"]
    sha = hashlib.sha256(CHATML.encode()).hexdigest()
    assert tokenization == {
        "record_format": "messages",
        "train_on": "assistant",
        "chat_template": "model",
        "chat_template_sha256": sha,
    }
    assert sha in (out / "adapter" / "README.md").read_text()
    assert "assistant turns of the conversations in column `messages`" in (out / "adapter" / "README.md").read_text()
    verified = runner.invoke(app, ["verify", str(out), "--public-key", str(signing_key[1])])
    assert verified.exit_code == 0, verified.output
    evaluated = runner.invoke(app, ["eval", str(out), "--json", "--show-private"])
    assert evaluated.exit_code == 0, evaluated.output
    numbers = json.loads(evaluated.output)
    assert numbers["adapter"]["tokens"] == numbers["base"]["tokens"] > 0


def test_resume_refuses_a_chat_template_change(chat_setup, signing_key):
    """A run interrupted under the model's template cannot resume raw (data.chat_template=none) or under an edited
    template: exit 2 naming it, the checkpoint kept."""
    import os
    import signal

    from dplora.run import checkpoint

    tmp, model, _ = chat_setup
    from dplora.data.demo import write_tickets

    tickets = tmp / "tickets.csv"
    write_tickets(tickets, num_tickets=40, seed=2)
    raw = contract_dict(model, tickets, tmp / "resumed", training={"steps": 6, "checkpoint_every": 1})
    cfg = write_contract(tmp / "resumed.yaml", raw)

    def hook(point, step):
        if point == "after-step" and step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    args = ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"]
    with checkpoint.fault_hook(hook):
        assert runner.invoke(app, args).exit_code == 130
    info = checkpoint.read_info(tmp / "resumed.partial")
    assert info.meta["tokenization"]["chat_template_sha256"] == hashlib.sha256(CHATML.encode()).hexdigest()
    raw_resume = runner.invoke(app, [*args, "--resume", "data.chat_template=none"])
    assert raw_resume.exit_code == 2, raw_resume.output
    assert "data.chat_template ('auto' → 'none')" in raw_resume.output
    config = model / "chat_template.jinja"
    config.write_text(CHATML.replace("helpful", "kind"))
    try:
        edited = runner.invoke(app, [*args, "--resume"])
    finally:
        config.write_text(CHATML)
    assert edited.exit_code == 2, edited.output
    assert "tokenized as model template" in edited.output and "resume needs the same tokenization" in edited.output
    assert checkpoint.read_info(tmp / "resumed.partial").step == 2
    finished = runner.invoke(app, [*args, "--resume"])
    assert finished.exit_code == 0, finished.output


def test_chat_compare_script_runs_at_toy_size(tmp_path):
    """scripts/chat_compare.py --toy: both runs train and are evaluated through the template, one reply each."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "scripts" / "chat_compare.py"
    spec = importlib.util.spec_from_file_location("chat_compare", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(["--toy", "--workdir", str(tmp_path)])
    for name in ("raw", "template"):
        assert result[name]["held_out_tokens"] > 0 and isinstance(result[name]["reply"], str)
        assert result[name]["held_out_loss_adapter"] > 0
    assert result["raw"]["held_out_tokens"] == result["template"]["held_out_tokens"]  # the same served tokens
    raw = release_statement(tmp_path / "raw")["predicate"]["tokenization"]
    assert raw["chat_template_sha256"] is None
    assert release_statement(tmp_path / "template")["predicate"]["tokenization"]["chat_template_sha256"] == (
        hashlib.sha256(module.CHATML.encode()).hexdigest()
    )
