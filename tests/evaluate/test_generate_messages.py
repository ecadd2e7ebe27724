"""`dplora generate --messages` (issue 31): conversations rendered through the run's recorded chat template with
the generation prompt; `--prompt` on a template run is a one-user-turn conversation; bad lines exit 2 naming the
line number, never its text; a changed template exits 2."""

from __future__ import annotations

import json

import pytest
from conftest import train_tiny
from tiny import CHATML, save_chat_model
from typer.testing import CliRunner

from dplora.cli.app import app

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")
NO_PAIR = {"prompt_column": None, "response_column": None}
GEN = ["--no-verify", "--max-new-tokens", "4"]
CONVERSATIONS = [
    [{"role": "user", "content": "where is my parcel"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "order 7 is late"},
        {"role": "assistant", "content": "sorry, it ships today"},
        {"role": "user", "content": "thanks, and order 8?"},
    ],
]


def _chats(path, n: int = 24):
    with open(path, "w") as fh:
        for i in range(n):
            turns = [{"role": "user", "content": f"order {i} is late"}, {"role": "assistant", "content": f"sorry {i}"}]
            fh.write(json.dumps({"dialog": turns}) + "\n")
    return path


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory, signing_key):
    tmp = tmp_path_factory.mktemp("genchat")
    model = save_chat_model(tmp / "model", CHATML)
    data = _chats(tmp / "chats.jsonl")
    result, out = train_tiny(
        tmp, model, data, signing_key, data={**NO_PAIR, "messages_column": "dialog"}, training={"max_seq_len": 96}
    )
    assert result.exit_code == 0, result.output
    return out, model


def _messages_file(path, lines: list) -> str:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return str(path)


def _reference_replies(run_folder, conversations, max_new_tokens: int) -> list[str]:
    """Greedy replies computed by hand: the template's own rendering with the generation prompt, then generate."""
    import torch

    from dplora.release.read import load_adapter_model, read_run

    model, tokenizer, _ = load_adapter_model(read_run(run_folder), threads=1, log=lambda *_: None)
    replies = []
    for conv in conversations:
        text = tokenizer.apply_chat_template(conv, chat_template=CHATML, tokenize=False, add_generation_prompt=True)
        assert text.endswith("<|im_start|>assistant\n")
        # the documented cut: the last max_seq_len − min(max_new_tokens, max_seq_len // 2) tokens (here 96 − 4)
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"][-(96 - max_new_tokens) :]])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        replies.append(tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True))
    return replies


def test_messages_render_through_the_template_with_the_generation_prompt(chat_run, tmp_path):
    out, _ = chat_run
    path = _messages_file(tmp_path / "m.jsonl", [CONVERSATIONS[0], {"dialog": CONVERSATIONS[1], "id": 3}])
    result = runner.invoke(app, ["generate", str(out), "--messages", path, *GEN, "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in result.stdout.strip().splitlines()[-2:]]
    assert [x["conversation"] for x in lines] == [1, 2]
    assert [x["reply"] for x in lines] == _reference_replies(out, CONVERSATIONS, 4)
    assert "order 7" not in result.stdout  # the conversation's text is not echoed


def test_prompt_on_a_template_run_is_a_one_user_turn_conversation(chat_run, tmp_path):
    """As training rendered a prompt/response pair under chat_template auto: (user: prompt) + generation prompt."""
    from dplora.contract.loader import load_contract
    from dplora.engine.model import load_model_and_tokenizer
    from dplora.evaluate.generate import prompt_ids

    out, _ = chat_run
    as_prompt = runner.invoke(app, ["generate", str(out), "--prompt", "where is my parcel", *GEN])
    path = _messages_file(tmp_path / "m.jsonl", [CONVERSATIONS[0]])
    as_messages = runner.invoke(app, ["generate", str(out), "--messages", path, *GEN])
    assert as_prompt.exit_code == as_messages.exit_code == 0, as_prompt.output + as_messages.output
    assert as_prompt.stdout.splitlines()[-1] == as_messages.stdout.splitlines()[-1]
    contract = load_contract(out / "contract.yaml")
    _, tokenizer = load_model_and_tokenizer(contract.model, lambda *_: None)
    ids = prompt_ids(contract.data, contract.training, tokenizer, "where is my parcel", 4)
    expected = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    expected += "<|im_start|>user\nwhere is my parcel<|im_end|>\n<|im_start|>assistant\n"
    full = tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert len(full) > 96 - 4 and ids == full[-(96 - 4) :]  # the last max_seq_len − max_new_tokens tokens
    assert tokenizer.decode(ids).endswith("<|im_start|>user\nwhere is my parcel<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("not json SECRET-TEXT", "not JSON"),
        ({"other": [{"role": "user", "content": "SECRET-TEXT"}]}, "without the run's messages column 'dialog'"),
        ([{"role": "robot", "content": "SECRET-TEXT"}], "message 1 has a role other than"),
        ([{"role": "user", "content": "SECRET-TEXT"}, {"role": "assistant", "content": "x"}], "assistant turn"),
        ([], "non-empty list"),
    ],
)
def test_a_bad_line_exits_2_naming_the_line_never_its_text(chat_run, tmp_path, line, needle):
    out, _ = chat_run
    path = _messages_file(tmp_path / "m.jsonl", [CONVERSATIONS[0], "", line])
    result = runner.invoke(app, ["generate", str(out), "--messages", path, *GEN])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "line 3" in lines[0] and needle in lines[0], lines
    assert "SECRET" not in result.output and "Traceback" not in result.output


def test_messages_and_prompt_are_mutually_exclusive(chat_run, tmp_path):
    out, _ = chat_run
    path = _messages_file(tmp_path / "m.jsonl", [CONVERSATIONS[0]])
    result = runner.invoke(app, ["generate", str(out), "--messages", path, "--prompt", "hi", *GEN])
    assert result.exit_code == 2 and "not both" in result.output, result.output


def test_a_changed_chat_template_exits_2(chat_run, tmp_path):
    out, model = chat_run
    path = _messages_file(tmp_path / "m.jsonl", [CONVERSATIONS[0]])
    config = model / "chat_template.jinja"
    config.write_text(CHATML.replace("helpful", "kind"))
    try:
        result = runner.invoke(app, ["generate", str(out), "--messages", path, *GEN])
        prompt = runner.invoke(app, ["generate", str(out), "--prompt", "hi", *GEN])
    finally:
        config.write_text(CHATML)
    for r in (result, prompt):
        assert r.exit_code == 2, r.output
        assert "chat template changed since training" in r.output and "Traceback" not in r.output


def test_messages_on_a_raw_run_exit_2(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """A run on a model without a template trained on raw f"{prompt}\\n" + response: no conversation format."""
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key)
    assert result.exit_code == 0, result.output
    path = _messages_file(tmp_path / "m.jsonl", [CONVERSATIONS[0]])
    gen = runner.invoke(app, ["generate", str(out), "--messages", path, *GEN])
    assert gen.exit_code == 2 and "raw text (no chat template)" in gen.output, gen.output
