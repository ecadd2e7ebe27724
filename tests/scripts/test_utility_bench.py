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


@pytest.mark.skipif(not (ROOT.parent / "shared" / "data" / "bitext_customer_support").is_dir(), reason="no data")
def test_toy_full_has_every_row_kind_and_the_share_of_the_control_gain(tmp_path):
    """The --full design (issue 33) at toy size: base, the control at the planner's B and T, DP with the planner's
    choice and DP with the demo's hand settings on both tasks; the shares and goals follow from the reported means."""
    bench = _bench()
    out = tmp_path / "u"
    argv = ["--toy", "--full", "--epsilons", "8", "--repeats", "1", "--out", str(out), "--threads", "1"]
    report = bench.main(argv)
    assert report["mode"] == "toy-full" and report["settings"]["repeats"] == 1
    rows = {(r["task"], r["name"]): r for r in report["rows"]}
    names = {"base", "non-private", "dp-planner-eps8", "dp-hand-eps8"}
    assert set(rows) == {(t, n) for t in ("banking77", "bitext") for n in names}
    assert {r["kind"] for r in report["rows"]} == {"base", "control", "dp-planner", "dp-hand"}
    for task in ("banking77", "bitext"):
        control, planner, hand = (rows[(task, n)] for n in ("non-private", "dp-planner-eps8", "dp-hand-eps8"))
        # the control trains non-privately at the planner's B, T and lr (the planner's choice at ε = 8)
        assert control["sigma"] == 0 and control["epsilon_spent"] is None and 0 < planner["epsilon_spent"] <= 8
        assert (control["batch"], control["steps"], control["lr"]) == (
            planner["batch"],
            planner["steps"],
            planner["lr"],
        )
        assert planner["lr_schedule"] == "cosine" and hand["lr_schedule"] is None
        # the hand row: configs/demo.yaml's B = 32 and lr 0.002 at the task's epochs, T = ceil(E·N/32)
        n = 160  # TOY_FULL.max_train_rows: every row is a unit
        epochs = getattr(bench.TOY_FULL, task).epochs
        assert (hand["batch"], hand["lr"], hand["steps"]) == (32, 0.002, math.ceil(epochs * n / 32))
        for r in (control, planner, hand):
            assert len(r["repeats"]) == 1 and r["spread"][next(iter(r["spread"]))] is None
            assert r["minutes"] > 0
    share = report["share_of_control_gain"]
    for task, metric in (("banking77", "accuracy"), ("bitext", "loss")):
        base, control = rows[(task, "base")]["eval"][metric], rows[(task, "non-private")]["eval"][metric]
        for kind, name in (("dp-planner", "dp-planner-eps8"), ("dp-hand", "dp-hand-eps8")):
            dp = rows[(task, name)]["eval"][metric]
            if metric == "loss":
                expected = (base - dp) / (base - control)
            else:
                expected = None if control == base else (dp - base) / (control - base)
            got = share[task]["by_epsilon"]["8"][kind]
            assert got == pytest.approx(expected) if expected is not None else got is None
    goal = report["goal"]
    s8 = share["bitext"]["by_epsilon"]["8"]["dp-planner"]
    assert goal["bitext"] == {"epsilon": 8, "share_of_control_gain": s8, "required": 0.9, "met": s8 >= 0.9}
    acc = {n: rows[("banking77", n)]["eval"]["accuracy"] for n in ("non-private", "dp-planner-eps8")}
    gap = acc["non-private"] - acc["dp-planner-eps8"]
    assert goal["banking77"]["control_minus_dp_points"] == round(100 * gap, 2)
    assert goal["banking77"]["met"] == (gap <= 0.03)
    md = (out / "utility.md").read_text()
    assert "| bitext | dp-hand-eps8 | 8 | 32 |" in md and "share of control's gain" in md
    assert json.loads((out / "utility.json").read_text())["hardware"].startswith(("CPU", "GPU"))
