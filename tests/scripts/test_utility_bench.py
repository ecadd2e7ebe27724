"""scripts/utility_bench.py --toy (issue 31): the Bitext task trains on one-turn conversations through the chat
template and its held-out loss counts exactly the assistant spans of the template's rendering."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from conftest import release_statement

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore:Unexpected keyword arguments:UserWarning"),
]


def _bench():
    spec = importlib.util.spec_from_file_location("utility_bench", ROOT / "scripts" / "utility_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["utility_bench"] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not (ROOT.parent / "shared" / "data" / "bitext_customer_support").is_dir(), reason="no data")
def test_toy_bitext_is_trained_and_scored_through_the_template(tmp_path):
    from transformers import AutoTokenizer

    bench = _bench()
    report = bench.main(["--toy", "--only", "bitext", "--out", str(tmp_path / "u"), "--threads", "1"])
    rows = {r["name"]: r for r in report["rows"]}
    assert set(rows) == {"base", "non-private", "dp-eps3"}
    template = (tmp_path / "u" / "toy-model" / "chat_template.jinja").read_text()
    for name in ("non-private", "dp-eps3"):
        tokenization = release_statement(Path(rows[name]["folder"]))["predicate"]["tokenization"]
        assert tokenization == {
            "record_format": "messages",
            "train_on": "assistant",
            "chat_template": "model",
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
        }
    # the held-out targets, by hand: what the assistant turn adds after the generation prompt (no truncation here)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "u" / "toy-model")
    _, held = bench.bitext_data(bench.TOY, tmp_path)
    assert held[0]["messages"][0]["role"] == "user" and held[0]["messages"][1]["role"] == "assistant"
    expected = 0
    for record in held:
        turns = record["messages"]
        context = tokenizer.apply_chat_template(turns[:1], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(turns, tokenize=False)
        n_full = len(tokenizer(full, add_special_tokens=False)["input_ids"])
        assert n_full <= bench.TOY.bitext.max_seq_len
        expected += n_full - len(tokenizer(context, add_special_tokens=False)["input_ids"])
    for row in rows.values():
        assert row["eval"]["tokens"] == expected and row["eval"]["records"] == len(held) == 6
        assert math.isfinite(row["eval"]["loss"]) and row["eval"]["loss"] > 0
    assert json.loads((tmp_path / "u" / "utility.json").read_text())["mode"] == "toy"
