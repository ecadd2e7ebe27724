"""`dplora generate --messages` (issue 31): conversations rendered through the run's recorded chat template with
the generation prompt; `--prompt` on a template run is a one-user-turn conversation; bad lines exit 2 naming the
line number, never its text; a changed template exits 2."""

from __future__ import annotations

import json

import pytest
from conftest import train_tiny
from tiny import CHATML, chat_tokenizer, save_chat_model
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
        # as served: the whole rendering (it fits the model's 128 positions), not training's max_seq_len cut
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
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
    """As served (and as training rendered a prompt/response pair under chat_template auto): (user: prompt) +
    generation prompt, the template's default system turn kept whole."""
    from dplora.contract.loader import load_contract
    from dplora.engine.model import load_model_and_tokenizer
    from dplora.evaluate.generate import served_prompt_ids

    out, _ = chat_run
    as_prompt = runner.invoke(app, ["generate", str(out), "--prompt", "where is my parcel", *GEN])
    path = _messages_file(tmp_path / "m.jsonl", [CONVERSATIONS[0]])
    as_messages = runner.invoke(app, ["generate", str(out), "--messages", path, *GEN])
    assert as_prompt.exit_code == as_messages.exit_code == 0, as_prompt.output + as_messages.output
    assert as_prompt.stdout.splitlines()[-1] == as_messages.stdout.splitlines()[-1]
    contract = load_contract(out / "contract.yaml")
    _, tokenizer = load_model_and_tokenizer(contract.model, lambda *_: None)
    ids = served_prompt_ids(contract.data, tokenizer, "where is my parcel", 4, context=128)
    expected = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    expected += "<|im_start|>user\nwhere is my parcel<|im_end|>\n<|im_start|>assistant\n"
    full = tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert len(full) > 96 - 4 and ids == full  # longer than training's old cut, fed whole


def _spy_on_generate(monkeypatch) -> list[list[int]]:
    """The token ids `dplora generate` hands the model's ``generate``, one list per prompt."""
    import dplora.release.read as read

    fed: list[list[int]] = []
    load = read.load_adapter_model

    class Spy:
        def __init__(self, model):
            self.model = model

        def __getattr__(self, name):
            return getattr(self.model, name)

        def generate(self, input_ids, **kw):
            fed.append(input_ids[0].tolist())
            return self.model.generate(input_ids=input_ids, **kw)

    def spied(*args, **kw):
        model, tokenizer, device = load(*args, **kw)
        return Spy(model), tokenizer, device

    monkeypatch.setattr(read, "load_adapter_model", spied)
    return fed


def _served(model_dir, conversation) -> list[int]:
    """What plain transformers feeds the merged export: the model's own chat template with the generation prompt."""
    from transformers import AutoTokenizer

    rendered = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(conversation, add_generation_prompt=True)
    return rendered if isinstance(rendered, list) else rendered["input_ids"]


def test_generate_feeds_the_model_what_apply_chat_template_gives(chat_run, tmp_path, monkeypatch):
    """--prompt and --messages: the ids equal ``apply_chat_template(messages, add_generation_prompt=True)`` of the
    same turns, the default system turn or the caller's own, longer than training's max_seq_len (96) and whole."""
    out, model_dir = chat_run
    fed = _spy_on_generate(monkeypatch)
    as_prompt = runner.invoke(app, ["generate", str(out), "--prompt", "where is my parcel", *GEN])
    path = _messages_file(tmp_path / "m.jsonl", CONVERSATIONS)
    as_messages = runner.invoke(app, ["generate", str(out), "--messages", path, *GEN])
    assert as_prompt.exit_code == as_messages.exit_code == 0, as_prompt.output + as_messages.output
    expected = [_served(model_dir, c) for c in (CONVERSATIONS[0], *CONVERSATIONS)]
    assert fed == expected
    assert len(expected[0]) > 96 - 4 and len(expected[2]) > 96  # past the old cut and past max_seq_len itself
    first_turns = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\norder 7"  # the caller's system turn
    assert chat_tokenizer().decode(expected[2]).startswith(first_turns)
    assert "warning" not in as_prompt.output + as_messages.output  # nothing was cut


def test_a_prompt_over_the_model_context_keeps_its_last_tokens_with_one_warning(chat_run, monkeypatch):
    """Only a prompt that with --max-new-tokens exceeds the model's 128 positions is cut (its last tokens, so the
    generation prompt stays), said in one stderr line that names no prompt text; a reply as long as the context
    leaves no room and is exit 2."""
    out, model_dir = chat_run
    fed = _spy_on_generate(monkeypatch)
    prompt = "SECRET " * 20
    result = runner.invoke(app, ["generate", str(out), "--prompt", prompt, *GEN])
    assert result.exit_code == 0, result.output
    full = _served(model_dir, [{"role": "user", "content": prompt}])
    assert len(full) + 4 > 128 and fed == [full[-(128 - 4) :]]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning")]
    assert warnings == [
        f"warning: a prompt of {len(full)} tokens plus --max-new-tokens 4 exceeds the model's context of 128 tokens: "
        f"its first {len(full) - 124} tokens are dropped"
    ]
    assert "SECRET" not in result.output
    too_long = runner.invoke(app, ["generate", str(out), "--prompt", "hi", "--no-verify", "--max-new-tokens", "128"])
    assert too_long.exit_code == 2 and "context is 128 tokens" in too_long.output, too_long.output
    assert "Traceback" not in too_long.output


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
    for r in (result, prompt):  # the base model's files are checked first now: the template is one of them
        assert r.exit_code == 2, r.output
        assert r.output.count("\n") == 1 and "Traceback" not in r.output
        assert "does not match the release's base model" in r.output and "chat_template.jinja" in r.output


def test_messages_on_a_raw_run_exit_2_and_a_prompt_is_fed_as_the_documented_raw_string(
    tmp_path, tiny_model_dir, tickets_csv, signing_key, monkeypatch
):
    """A run on a model without a template trained on raw f"{prompt}\\n" + response: no conversation format; a
    prompt is fed as ``tokenizer(prompt + "\\n", add_special_tokens=False)`` (docs/serving.md), whole even when
    longer than training's max_seq_len (48) would have kept."""
    from tiny import byte_tokenizer

    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key)
    assert result.exit_code == 0, result.output
    path = _messages_file(tmp_path / "m.jsonl", [CONVERSATIONS[0]])
    gen = runner.invoke(app, ["generate", str(out), "--messages", path, *GEN])
    assert gen.exit_code == 2 and "raw text (no chat template)" in gen.output, gen.output
    fed = _spy_on_generate(monkeypatch)
    prompt = "my parcel never arrived and nobody answers my emails about it"
    gen = runner.invoke(app, ["generate", str(out), "--prompt", prompt, *GEN])
    assert gen.exit_code == 0, gen.output
    expected = byte_tokenizer()(prompt + "\n", add_special_tokens=False)["input_ids"]
    assert len(expected) > 48 and fed == [expected]
