"""Audit canaries as conversations (issue 31): on a messages contract the canary is a user turn + the secret in the
assistant turn, trained and scored through the chat template with the mask of training (assistant span only)."""

from __future__ import annotations

import json
import math

import pytest
from conftest import contract_dict, write_contract
from tiny import CHATML, save_chat_model
from typer.testing import CliRunner

from dplora.audit import canaries
from dplora.cli.app import app

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")
NO_PAIR = {"prompt_column": None, "response_column": None}
PRIVATE_MARK = "PRIVATE-TICKET-TEXT"


def _chats(path, n: int = 24):
    with open(path, "w") as fh:
        for i in range(n):
            turns = [
                {"role": "user", "content": f"{PRIVATE_MARK} order {i} is late"},
                {"role": "assistant", "content": f"sorry, order {i} ships today"},
            ]
            fh.write(json.dumps({"customer": f"c{i % 8}", "messages": turns}) + "\n")
    return path


def _contract(tmp_path):
    from dplora.contract.loader import parse_contract

    model = save_chat_model(tmp_path / "model", CHATML)
    raw = contract_dict(
        model,
        _chats(tmp_path / "chats.jsonl"),
        tmp_path / "o",
        data=NO_PAIR,
        privacy={"protected_unit": "user", "unit_key": "customer", "num_units": 14},
        training={"max_seq_len": 256, "steps": 2},
    )
    return raw, parse_contract(raw)


def test_a_messages_canary_is_a_conversation_with_the_secret_in_the_assistant_turn(tmp_path):
    """Its record renders through the template; the targets are exactly the assistant span (secret included)."""
    import datasets

    from dplora.data.tokens import tokenize_records
    from dplora.engine.model import load_model_and_tokenizer

    _, contract = _contract(tmp_path)
    rows = canaries.canary_rows(
        contract.data, contract.privacy.unit_key, "dplora-canary-00000", "K7QX-09AZ-M2LT-4RQ8", copies=2
    )
    assert len(rows) == 2 and all(r["customer"] == "dplora-canary-00000" for r in rows)
    reply = canaries.REPLY.format(secret="K7QX-09AZ-M2LT-4RQ8")
    conversation = [{"role": "user", "content": canaries.PROMPT}, {"role": "assistant", "content": reply}]
    assert rows[0]["messages"] == conversation
    _, tokenizer = load_model_and_tokenizer(contract.model, lambda *_: None)
    (ids, labels), second = tokenize_records(
        datasets.Dataset.from_list(rows), tokenizer, contract.data, max_seq_len=contract.training.max_seq_len
    )
    assert second == (ids, labels)  # both copies are the same record
    full = tokenizer.apply_chat_template(conversation, chat_template=CHATML, tokenize=False)
    assert tokenizer.decode(ids) == full
    targets = tokenizer.decode([t for t in labels if t != -100])
    assert targets == reply + "<|im_end|>\n"  # the assistant span alone: not the prompt, not the turn header


def test_audit_of_a_messages_contract_scores_canaries_through_the_template(tmp_path):
    """A full `dplora audit` on a conversations contract: each canary's adapter loss equals the mean NLL of its
    assistant span computed by hand from the template's rendering; nothing private in the report."""
    import torch

    from dplora.release.read import load_adapter_model, read_run

    raw, _ = _contract(tmp_path)
    cfg = write_contract(tmp_path / "a.yaml", raw)
    args = ["audit", str(cfg), "--canaries", "8", "--candidates", "10", "--no-progress", "--threads", "1"]
    result = runner.invoke(app, [*args, "--data-source", "surrogate"])
    assert result.exit_code in (0, 5), result.output
    folder = tmp_path / "o-audit"
    text = (folder / "audit.json").read_text()
    assert PRIVATE_MARK not in text and PRIVATE_MARK not in (folder / "audit.md").read_text()
    assert PRIVATE_MARK not in result.output
    report = json.loads(text)
    model, tokenizer, _ = load_adapter_model(read_run(folder / "run"), threads=1, log=lambda *_: None)
    for c in report["per_canary"][:3]:
        reply = canaries.REPLY.format(secret=c["secret"])
        prompt = [{"role": "user", "content": canaries.PROMPT}]
        context = tokenizer.apply_chat_template(
            prompt, chat_template=CHATML, tokenize=False, add_generation_prompt=True
        )
        full = tokenizer.apply_chat_template(
            [*prompt, {"role": "assistant", "content": reply}], chat_template=CHATML, tokenize=False
        )
        n_context = len(tokenizer(context, add_special_tokens=False)["input_ids"])
        ids = torch.tensor([tokenizer(full, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
        nll = -logp[torch.arange(ids.shape[1] - 1), ids[0, 1:]]
        by_hand = float(nll[n_context - 1 :].mean())  # targets: the tokens after the generation prompt
        assert c["adapter_loss"] == pytest.approx(by_hand, rel=1e-4)
        assert math.isfinite(c["base_loss"]) and c["score"] == pytest.approx(c["base_loss"] - c["adapter_loss"])


def test_a_pair_canary_under_chat_template_auto_is_scored_on_the_assistant_span(tmp_path):
    """A prompt/response contract on a model with a template renders the canary pair as the same conversation."""
    import datasets

    from dplora.contract.loader import parse_contract
    from dplora.data.tokens import tokenize_records
    from dplora.engine.model import load_model_and_tokenizer

    model = save_chat_model(tmp_path / "model", CHATML)
    raw = contract_dict(model, tmp_path / "t.csv", tmp_path / "o", training={"max_seq_len": 256})
    contract = parse_contract(raw)
    rows = canaries.canary_rows(contract.data, contract.privacy.unit_key, "c0", "K7QX-09AZ-M2LT-4RQ8")
    reply = canaries.REPLY.format(secret="K7QX-09AZ-M2LT-4RQ8")
    assert rows == [{"message": canaries.PROMPT, "reply": reply}]
    _, tokenizer = load_model_and_tokenizer(contract.model, lambda *_: None)
    [(ids, labels)] = tokenize_records(
        datasets.Dataset.from_list(rows), tokenizer, contract.data, max_seq_len=contract.training.max_seq_len
    )
    conversation = [{"role": "user", "content": canaries.PROMPT}, {"role": "assistant", "content": reply}]
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(conversation, chat_template=CHATML, tokenize=False)
    assert tokenizer.decode([t for t in labels if t != -100]) == reply + "<|im_end|>\n"
