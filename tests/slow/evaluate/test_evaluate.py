"""The slow tier of tests/evaluate/test_evaluate.py, whose docstring describes the module."""

from __future__ import annotations

import base64
import csv
import json
from pathlib import Path

import pytest
import torch
from conftest import contract_dict, train_tiny
from support.evaluate import runner

from dplora.cli.app import app
from dplora.contract.loader import parse_contract

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


def _payload(out: Path) -> dict:
    envelope = json.loads((out / "release.dsse.json").read_text())
    return json.loads(base64.b64decode(envelope["payload"]))


def _metrics_eval(out: Path) -> dict:
    lines = [json.loads(x) for x in (out.with_name(out.name + ".private") / "metrics.jsonl").read_text().splitlines()]
    found = [x.get("not_covered_by_dp", x).get("eval") for x in lines if "eval" in x.get("not_covered_by_dp", x)]
    assert len(found) == 1
    return found[0]


@pytest.fixture(scope="module")
def split_run(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    """A finished DP run holding out 25 % of the rows (row-level units)."""
    tmp = tmp_path_factory.mktemp("eval")
    result, out = train_tiny(tmp, tiny_model_dir, tickets_csv, signing_key, data={"eval_fraction": 0.25})
    cfg = tmp / "run.yaml"
    assert result.exit_code == 0, result.output
    return result, out, cfg


def test_private_eval_numbers_never_enter_the_record(split_run, tickets_csv, signing_key):
    """Train writes base vs adapter labelled NOT COVERED BY DP to its private log (not the public stderr, which a
    CI job publishes), logs them under not_covered_by_dp, signs none."""
    result, out, _ = split_run
    private = (out.with_name(out.name + ".private") / "train.log").read_text()
    assert "NOT COVERED BY DP" in private and "NOT COVERED BY DP" not in result.output
    metrics = _metrics_eval(out)
    assert metrics["public"] is False
    payload = json.dumps(_payload(out))
    assert "evaluation" not in _payload(out)["predicate"]
    for model in ("base", "adapter"):
        loss = metrics[model]["loss"]
        assert f"{loss:.4f}" in private and f"{loss:.4f}" not in result.output  # the private log only...
        assert repr(loss) not in payload and f"{loss:.4f}" not in payload  # ...never signed
    acc = _payload(out)["predicate"]["accounting"]
    with open(tickets_csv, newline="") as fh:
        rows = sum(1 for _ in csv.DictReader(fh))
    assert acc["num_units"] + metrics["base"]["records"] == rows  # N counts the training side only
    check = runner.invoke(app, ["verify", str(out), "--public-key", str(signing_key[1])])
    assert check.exit_code == 0, check.output


def test_eval_command_reproduces_the_split_and_the_numbers(split_run):
    """`dplora eval RUN` (and `dplora eval CONFIG`) re-creates the same held-out split from contract.yaml."""
    result, out, cfg = split_run
    metrics = _metrics_eval(out)
    for target in (out, cfg):
        got = runner.invoke(app, ["eval", str(target), "--json", "--show-private"])
        assert got.exit_code == 0, got.output
        report = json.loads(got.output)
        assert report["base"]["records"] == metrics["base"]["records"]
        assert report["base"]["tokens"] == metrics["base"]["tokens"]
        for model in ("base", "adapter"):
            assert report[model]["loss"] == pytest.approx(metrics[model]["loss"], rel=1e-6)
        assert report["adapter"]["loss"] != report["base"]["loss"]
        assert report["public"] is False and report["differentially_private"] is True
    text = runner.invoke(app, ["eval", str(out), "--show-private"])
    assert text.exit_code == 0 and "NOT COVERED BY DP" in text.output and "perplexity" in text.output
    # without a terminal (a CI log) the numbers stay in <run>.private/eval.json: one public line, no number
    quiet = runner.invoke(app, ["eval", str(out), "--json"])
    assert quiet.exit_code == 0, quiet.output
    doc = json.loads(quiet.stdout)
    assert doc["public"] is False and "base" not in doc and f"{metrics['base']['loss']:.4f}" not in quiet.output
    saved = json.loads(Path(doc["private_report"]).read_text())
    assert saved["base"]["loss"] == pytest.approx(metrics["base"]["loss"], rel=1e-6)
    assert Path(doc["private_report"]).parent == out.with_name(out.name + ".private")


def test_public_eval_set_enters_the_record(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """data.eval_public: true with data.eval_path: the numbers are signed (and equal the logged ones)."""
    public = tmp_path / "public.csv"
    public.write_text("message,reply\nwhere is my parcel,it ships tomorrow\nreset my password,use the reset link\n")
    data = {"eval_path": str(public), "eval_public": True}
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, data=data)
    assert result.exit_code == 0, result.output
    signed = _payload(out)["predicate"]["evaluation"]
    metrics = _metrics_eval(out)
    assert signed["public"] is True and signed["base"]["records"] == 2
    assert signed["adapter"]["loss"] == pytest.approx(metrics["adapter"]["loss"], rel=1e-12)
    assert "declared public" in result.output and "NOT COVERED" not in result.output


def test_eval_refuses_runs_without_release_or_held_out_set(tmp_path, split_run, tickets_csv):
    _, out, _ = split_run
    none = runner.invoke(app, ["eval", str(tmp_path / "missing")])
    assert none.exit_code == 2 and "no such run folder" in none.output
    partial = tmp_path / "run.partial"
    partial.mkdir()
    (partial / "FAILED.json").write_text("{}")
    failed = runner.invoke(app, ["eval", str(partial)])
    assert failed.exit_code == 2 and "has no release.dsse.json" in failed.output
    explicit = runner.invoke(app, ["eval", str(out), "--eval-path", str(tickets_csv), "--json", "--show-private"])
    assert explicit.exit_code == 0 and json.loads(explicit.output)["base"]["records"] == 120


def test_generate_is_deterministic_under_greedy(split_run, signing_key):
    """Two `dplora generate` runs print the same reply, and it is the token-by-token argmax of base + adapters."""
    from dplora.evaluate.generate import Sampling, generate_replies, prompt_ids
    from dplora.release.read import load_adapter_model, read_run

    _, out, _ = split_run
    key = ["--public-key", str(signing_key[1])]
    args = ["generate", str(out), "--prompt", "my order never arrived", "--max-new-tokens", "6", "--json", *key]
    first, second = runner.invoke(app, args), runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert first.output == second.output
    reply = json.loads(first.output)["reply"]
    run = read_run(out)
    model, tokenizer, device = load_adapter_model(run, threads=1, log=lambda _: None)
    ids = prompt_ids(run.contract.data, run.contract.training, tokenizer, "my order never arrived", 6)
    assert tokenizer.decode(ids) == "my order never arrived\n"
    with torch.no_grad():
        for _ in range(6):
            nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
            if nxt == tokenizer.eos_token_id:
                break
    prompt_len = len(prompt_ids(run.contract.data, run.contract.training, tokenizer, "my order never arrived", 6))
    assert reply == tokenizer.decode(ids[prompt_len:], skip_special_tokens=True)
    direct = generate_replies(
        model,
        tokenizer,
        ["my order never arrived"],
        data=run.contract.data,
        training=run.contract.training,
        sampling=Sampling(max_new_tokens=6),
        device=device,
    )
    assert direct == [reply]
    seeded = ["generate", str(out), "--prompt", "hi", "--temperature", "1.0", "--top-p", "0.9", "--seed", "3", *key]
    assert runner.invoke(app, seeded).output == runner.invoke(app, seeded).output


@pytest.mark.parametrize(
    ("extra", "needle"),
    [([], "exactly one of --prompt"), (["--prompt", "x", "--prompts", "f.txt"], "exactly one of --prompt")],
)
def test_generate_needs_exactly_one_prompt_source(split_run, extra, needle):
    _, out, _ = split_run
    result = runner.invoke(app, ["generate", str(out), *extra, "--no-verify"])
    assert result.exit_code == 2 and needle in result.output


def test_missing_label_column_is_refused_before_training(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """A held-out file without the label column: exit 2 before the first step, nothing written."""
    held = tmp_path / "held.csv"
    held.write_text("message,reply\nwhere is my parcel,it ships tomorrow\n")
    data = {"eval_path": str(held), "label_column": "intent"}
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, data=data)
    assert result.exit_code == 2 and "no column 'intent'" in result.output
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()
    data = {"eval_path": str(held), "group_column": "category"}
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, name="run2", data=data)
    assert result.exit_code == 2 and "no column 'category' (the group column)" in result.output
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()


def _hand_nll(model, ids: list[int], labels: list[int]) -> tuple[float, int]:
    """One sequence, no padding, an explicit loop over target positions: (Σ −log p(target), #targets)."""
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), dim=-1)
    nll, count = 0.0, 0
    for t in range(1, len(ids)):
        if labels[t] != -100:
            nll -= float(logp[t - 1, labels[t]])
            count += 1
    return nll, count


def test_per_group_report_matches_a_hand_computation(tmp_path, tiny_model_dir):
    """Per-group loss = Σ NLL / Σ target tokens over the group's rows, each row scored alone; a group under
    MIN_GROUP_RECORDS rows is counted, never named; base and adapters both; the sums add up to the overall loss."""
    import datasets
    from peft import LoraConfig, get_peft_model
    from tiny import byte_tokenizer
    from transformers import AutoModelForCausalLM

    from dplora.data.tokens import tokenize_records
    from dplora.evaluate.heldout import evaluate_model
    from dplora.evaluate.report import MIN_GROUP_RECORDS

    assert MIN_GROUP_RECORDS == 10
    words = ["refund", "parcel", "login", "invoice", "card", "address", "order", "password"]
    rows = []
    for i in range(23):  # 11 BILLING, 10 SHIPPING (exactly the threshold), 2 RARE (hidden)
        group = "BILLING" if i < 11 else ("SHIPPING" if i < 21 else "RARE")
        rows.append(
            {"message": f"my {words[i % 8]} {i}", "reply": f"about your {words[(3 * i) % 8]}" + "!" * (i % 5),
             "category": group}
        )  # fmt: skip
    table = datasets.Dataset.from_list(rows)
    held = tmp_path / "held.csv"
    table.to_csv(held, index=False)
    raw = contract_dict(tiny_model_dir, held, tmp_path / "o", data={"eval_path": str(held), "group_column": "category"})
    contract = parse_contract(raw)
    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # adapters that change the loss
    tokenizer = byte_tokenizer()
    got = evaluate_model(
        model,
        tokenizer,
        table,
        contract.data,
        contract.training,
        device="cpu",
        source="held.csv",
        public=False,
        private_run=True,
    )
    examples = tokenize_records(table, tokenizer, contract.data, max_seq_len=contract.training.max_seq_len)
    model.eval()
    for which in ("adapter", "base"):
        per_row = []
        for ids, labels in examples:
            if which == "base":
                with model.disable_adapter():
                    per_row.append(_hand_nll(model, ids, labels))
            else:
                per_row.append(_hand_nll(model, ids, labels))
        expected = {}
        for row, (nll, count) in zip(rows, per_row, strict=True):
            s, c, n = expected.get(row["category"], (0.0, 0, 0))
            expected[row["category"]] = (s + nll, c + count, n + 1)
        stats = got.groups[which]
        assert [g.group for g in stats] == ["BILLING", "SHIPPING"]  # sorted; RARE (2 rows) is not named
        for g in stats:
            s, c, n = expected[g.group]
            assert (g.records, g.tokens) == (n, c)
            assert g.loss == pytest.approx(s / c, rel=1e-6)
            assert g.accuracy is None
        total = sum(s for s, _, _ in expected.values()) / sum(c for _, c, _ in expected.values())
        assert getattr(got, which).loss == pytest.approx(total, rel=1e-6)
    assert got.groups["hidden"] == {"groups": 1, "records": 2, "min_records": 10}
    assert got.groups["adapter"][0].loss != pytest.approx(got.groups["base"][0].loss, rel=1e-3)
    text = "\n".join(report_lines_of(got))
    assert "BILLING" in text and "SHIPPING" in text and "RARE" not in text
    assert "1 groups with fewer than 10 records, 2 records in all, are not shown by name" in text
    doc = got.to_dict()["groups"]
    assert [g["group"] for g in doc["adapter"]] == ["BILLING", "SHIPPING"] and "RARE" not in json.dumps(doc)


def report_lines_of(evaluation):
    from dplora.evaluate.report import report_lines

    return report_lines(evaluation)


def test_eval_group_column_cli(split_run, tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """`dplora eval --group-column`: only the contract's declared data.group_column, refused by name (exit 2, one
    JSON document) and never by its values; the per-group table is a private diagnostic (issue 40 item 4): off a
    terminal it is in <run>.private/eval.json only; rare values (customer ids) are never named."""
    _, out, _ = split_run
    undeclared = runner.invoke(app, ["eval", str(out), "--group-column", "customer_id", "--json"])
    assert undeclared.exit_code == 2
    err = json.loads(undeclared.stdout)
    assert err == {"ok": False, "exit_code": 2, "error": err["error"]} and "data.group_column" in err["error"]
    data = {"eval_fraction": 0.25, "group_column": "customer_id"}
    result, grouped = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, data=data)
    assert result.exit_code == 0, result.output
    quiet = runner.invoke(app, ["eval", str(grouped), "--group-column", "customer_id"])
    assert quiet.exit_code == 0 and "customer_id" not in quiet.stdout and "private" in quiet.stdout
    got = runner.invoke(app, ["eval", str(grouped), "--json", "--show-private"])
    assert got.exit_code == 0, got.output
    doc = json.loads(got.output)
    assert doc["ok"] is True and doc["groups"]["column"] == "customer_id"
    assert doc["groups"]["adapter"] == [] and doc["groups"]["hidden"]["records"] == doc["base"]["records"]
    saved = json.loads((grouped.with_name(grouped.name + ".private") / "eval.json").read_text())
    assert saved["groups"] == doc["groups"]


def test_eval_of_a_run_without_a_held_out_set_says_so_before_any_file_option(tmp_path, tiny_model_dir, tickets_csv,
                                                                           signing_key):  # fmt: skip
    """No held-out set: the line says so and how to give one, also when --data is given (which would otherwise be
    refused as unused, a line that sends the user the wrong way)."""
    from conftest import train_tiny

    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key)
    assert result.exit_code == 0, result.output
    for extra in ([], ["--data", str(tickets_csv)]):
        got = runner.invoke(app, ["eval", str(out), *extra])
        assert got.exit_code == 2 and got.output.count("\n") == 1, got.output
        assert "no held-out set" in got.output and "pass --eval-path FILE" in got.output
