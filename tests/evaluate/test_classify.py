"""Classification as a declared task: label ranking by length-normalised log-likelihood with contextual calibration
(Zhao et al. 2021), checked against a brute-force scorer; the calibration bias is the same on neighbouring held-out
sets; `generate --choices` chooses what the evaluation chooses; bad label sets exit 2 from the contract and file
identity alone."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from conftest import INTENT_LABELS as LABELS
from conftest import contract_dict, minimal_contract, train_tiny, write_contract
from conftest import intent_rows as _rows
from conftest import write_intents as _write
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.contract.loader import parse_contract

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cls")
    train = _write(tmp / "train.csv", _rows(4))  # 36 rows
    held = _write(tmp / "held.csv", [*_rows(1), ("my card is gone", "not_a_declared_label")])  # 10 rows
    labels = tmp / "labels.txt"
    labels.write_text("\n".join(LABELS) + "\n")
    return train, held, labels


def _contract(tiny_model_dir, files, tmp_path, **data):
    train, held, labels = files
    data = {"eval_path": str(held), "task": "classification", "labels_file": str(labels), **data}
    return parse_contract(contract_dict(tiny_model_dir, train, tmp_path / "o", data=data, privacy={"num_units": 36}))


def _peft(tiny_model_dir):
    """The tiny Llama with LoRA adapters whose B is perturbed (seeded), so adapters and base differ."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
    return peft.eval()


def _brute_score(model, tokenizer, prompt: str, label: str) -> float:
    """Mean log p of the label's tokens and EOS after ``prompt\\n``: one sequence, an explicit loop."""
    p = tokenizer([f"{prompt}\n"], add_special_tokens=False)["input_ids"][0]
    y = tokenizer([label], add_special_tokens=False)["input_ids"][0] + [tokenizer.eos_token_id]
    ids = p + y
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), dim=-1)
    return sum(float(logp[t - 1, ids[t]]) for t in range(len(p), len(ids))) / len(y)


def test_scores_match_a_brute_force_scorer_on_three_labels(tiny_model_dir, files, tmp_path):
    from tiny import byte_tokenizer

    from dplora.evaluate.classify import choose, classify

    contract = _contract(tiny_model_dir, files, tmp_path)
    model, tokenizer = _peft(tiny_model_dir), byte_tokenizer()
    prompts = ["I lost my card", "where is my parcel"]
    bias, scores = classify(model, tokenizer, prompts, LABELS, contract.data, contract.training, device="cpu")
    want_bias = [_brute_score(model, tokenizer, "N/A", y) for y in LABELS]
    assert bias == pytest.approx(want_bias, rel=1e-5)
    for prompt, got in zip(prompts, scores, strict=True):
        want = [_brute_score(model, tokenizer, prompt, y) for y in LABELS]
        assert got == pytest.approx(want, rel=1e-5)
        calibrated = [w - b for w, b in zip(want, want_bias, strict=True)]
        choice = choose(LABELS, got, bias)
        assert choice.label == LABELS[max(range(3), key=calibrated.__getitem__)]
        # calibrated = score − bias, exactly; each side already matches the brute force to rel 1e-5 above. (A
        # tolerance on the difference itself, ~0.02 of two ~1.3 terms, failed now and then on float32 rounding.)
        assert list(choice.scores.values()) == [g - b for g, b in zip(got, bias, strict=True)]
    # length normalisation: the summed score would be far lower for the long label than the mean is
    summed = _brute_score(model, tokenizer, prompts[0], LABELS[2]) * (len(LABELS[2]) + 1)
    assert summed < min(scores[0])


def test_calibration_bias_is_the_same_on_neighbouring_held_out_sets(tiny_model_dir, files, tmp_path):
    """D's held-out file and D' (one record removed): the same adapters give the identical bias vector."""
    import datasets
    from tiny import byte_tokenizer

    from dplora.evaluate.heldout import evaluate_model

    contract = _contract(tiny_model_dir, files, tmp_path)
    model, tokenizer = _peft(tiny_model_dir), byte_tokenizer()
    rows = list(csv.DictReader(files[1].open()))
    full = datasets.Dataset.from_list(rows)
    neighbour = datasets.Dataset.from_list(rows[:3] + rows[4:])

    def run(table):
        return evaluate_model(
            model, tokenizer, table, contract.data, contract.training, device="cpu", source="t", public=False,
            private_run=True,
        ).to_dict()["classification"]  # fmt: skip

    a, b = run(full), run(neighbour)
    for m in ("base", "adapter"):
        assert a[m]["bias"] == b[m]["bias"]  # exactly: a function of model, adapters, labels and "N/A" only
    assert a["base"]["bias"] != a["adapter"]["bias"]
    assert a["records"] == 10 and a["out_of_set"] == 1 and a["calibration_input"] == "N/A"


def test_stats_count_an_out_of_set_label_as_wrong_and_hide_small_labels():
    from dplora.evaluate.classify import classification_stats

    labels = ["a", "b", "c"]
    scores = [[0.0, -1.0, -9.0]] * 2 + [[-1.0, 0.0, -9.0]] + [[0.0, -1.0, -9.0]] * 2  # uncalibrated: a, a, b, a, a
    bias = [0.0, -2.0, 0.0]  # calibrated: b wins unless a leads by more than 2 nats/token
    got = classification_stats(labels, ["b", "b", "b", "zzz", "c"], scores, bias, min_records=2)
    assert got["accuracy"] == pytest.approx(3 / 5)  # calibrated: b everywhere; "zzz" is outside the set: wrong
    assert got["accuracy_uncalibrated"] == pytest.approx(1 / 5)
    assert got["per_label"] == [{"label": "b", "records": 3, "recall": 1.0}]
    assert got["hidden"] == {"labels": 1, "records": 1, "min_records": 2}


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory, tiny_model_dir, files, signing_key):
    tmp = tmp_path_factory.mktemp("clsrun")
    train, held, labels = files
    data = {"eval_path": str(held), "task": "classification", "labels": LABELS}
    result, out = train_tiny(tmp, tiny_model_dir, train, signing_key, data=data, privacy={"num_units": 36})
    assert result.exit_code == 0, result.output
    return out


def test_a_classification_run_reports_privately_and_generate_choices_agrees(cls_run, signing_key, tiny_model_dir):
    from dplora.evaluate.classify import choose, classify
    from dplora.release.read import load_adapter_model, read_run

    out = cls_run
    private = out.with_name(out.name + ".private")
    lines = [json.loads(x) for x in (private / "metrics.jsonl").read_text().splitlines()]
    evals = [x["not_covered_by_dp"]["eval"] for x in lines if "eval" in x.get("not_covered_by_dp", {})]
    assert len(evals) == 1 and evals[0]["classification"]["labels"] == 3
    assert "classification" not in json.dumps(json.loads((out / "release.dsse.json").read_text()))
    result = runner.invoke(app, ["eval", str(out), "--json", "--show-private"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["classification"]["adapter"]["accuracy"] is not None

    run = read_run(out)
    model, tokenizer, device = load_adapter_model(run, threads=1, log=lambda _: None)
    prompts = ["my card was stolen #0", "where is my parcel #0"]
    bias, scores = classify(model, tokenizer, prompts, LABELS, run.contract.data, run.contract.training, device=device)
    key = ["--public-key", str(signing_key[1])]
    for prompt, s in zip(prompts, scores, strict=True):
        want = choose(LABELS, s, bias)
        args = ["generate", str(out), "--prompt", prompt, "--choices", ",".join(LABELS), "--json", *key]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        got = json.loads(result.output.strip().splitlines()[-1])
        assert set(got) == {"label", "scores"} and got["label"] == want.label
        assert got["scores"] == pytest.approx(want.scores)
    text = runner.invoke(app, ["generate", str(out), "--prompt", prompts[0], "--choices", ",".join(LABELS), *key])
    assert text.exit_code == 0 and text.output.splitlines()[0] in LABELS


@pytest.mark.parametrize(
    ("choices", "needle"),
    [("a,a", "repeats label 1"), ("a,,b", "label 2 is empty"), ("x" * 201, "at most 200")],
)
def test_bad_choices_exit_2(cls_run, choices, needle):
    result = runner.invoke(app, ["generate", str(cls_run), "--prompt", "hi", "--choices", choices, "--no-verify"])
    assert result.exit_code == 2 and needle in result.output


def test_choices_file_that_is_the_data_file_exits_2(cls_run, files):
    args = ["generate", str(cls_run), "--prompt", "hi", "--choices", f"@{files[0]}", "--no-verify"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "data.path (private data)" in result.output


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"task": "classification"}, "needs a declared label set"),
        ({"task": "classification", "labels": []}, "an empty label set"),
        ({"task": "classification", "labels": ["a", "a"]}, "repeats label 1"),
        ({"task": "classification", "labels": ["a" * 201]}, "at most 200"),
        ({"task": "classification", "labels": [f"l{i}" for i in range(1001)]}, "at most 1000"),
        ({"labels": ["a"]}, "needs data.task: classification"),
    ],
)
def test_bad_label_sets_exit_2_from_the_contract(tmp_path, tiny_model_dir, files, data, needle):
    raw = contract_dict(tiny_model_dir, files[0], tmp_path / "o", data=data, privacy={"num_units": 36})
    result = runner.invoke(app, ["validate", str(write_contract(tmp_path / "c.yaml", raw))])
    assert result.exit_code == 2 and needle in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_labels_file_that_is_the_data_file_is_refused_before_training(tmp_path, tiny_model_dir, files, signing_key):
    train, held, _ = files
    link = tmp_path / "labels-link.csv"
    link.symlink_to(train)  # another name for the same file: found by identity, never by content
    empty, dup = tmp_path / "empty.txt", tmp_path / "dup.txt"
    empty.write_text("\n \n")
    dup.write_text("a\nb\na\n")
    for name, labels_file, needle in [
        ("r1", train, "is the contract's data.path"),
        ("r2", link, "is the contract's data.path"),
        ("r3", held, "is the contract's data.eval_path"),
        ("r4", empty, "an empty label set"),
        ("r5", dup, "repeats label 1"),
    ]:
        data = {"eval_path": str(held), "task": "classification", "labels_file": str(labels_file)}
        result, out = train_tiny(tmp_path, tiny_model_dir, train, signing_key, name=name, data=data,
                                 privacy={"num_units": 36})  # fmt: skip
        assert result.exit_code == 2 and needle in result.output, (name, result.output)
        assert not out.exists() and not out.with_name(out.name + ".partial").exists()


def test_default_contract_yaml_is_unchanged_by_the_task_keys(tmp_path, tiny_model_dir, files):
    """A generation contract's YAML (and so its digest and every release record) has none of the new keys."""
    raw = contract_dict(tiny_model_dir, files[0], tmp_path / "o", privacy={"num_units": 36})
    text = parse_contract(raw).to_yaml()
    assert not any(k in text for k in ("task:", "labels", "calibration_input"))
    assert "task: classification" in _contract(tiny_model_dir, files, tmp_path).to_yaml()


def test_a_chat_template_run_scores_the_label_as_the_assistant_turn_it_trained_on():
    """Through a chat template the label is the assistant turn (its content and end-of-turn marker are the targets,
    as in training); the score is their mean log-probability, checked with an explicit loop."""
    from tiny import CHATML, chat_tokenizer, tiny_llama

    from dplora.data.chat import ChatEncoder
    from dplora.evaluate.classify import label_scores

    contract = minimal_contract(max_len=128)
    data = contract.data.model_copy(update={"task": "classification", "labels": tuple(LABELS)})
    tok, model = chat_tokenizer(CHATML), tiny_llama(vocab_size=264).eval()
    got = label_scores(model, tok, "I lost my card", LABELS, data, contract.training, device="cpu", batch_size=2)
    for label, score in zip(LABELS, got, strict=True):
        ids, labels = ChatEncoder(tok, CHATML, 128).encode(
            [{"role": "user", "content": "I lost my card"}, {"role": "assistant", "content": label}]
        )
        targets = [t for t in range(1, len(ids)) if labels[t] != -100]
        assert tok.decode([ids[t] for t in targets]) == f"{label}<|im_end|>\n"
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), dim=-1)
        assert score == pytest.approx(sum(float(logp[t - 1, ids[t]]) for t in targets) / len(targets), rel=1e-5)


def test_training_labels_outside_the_set_are_counted_privately_and_trained(tmp_path, tiny_model_dir, signing_key):
    """Two training records answer with a label outside the declared set: the run trains (never refuses: the exit
    code would follow one record), the private train.log counts them, and the public output is the one a file
    without them gives (D and D' differ by those two rows, N declared)."""
    outputs = {}
    for name, extra in (("d", []), ("d2", [("card gone #x", "not_declared"), ("parcel late #x", "late_parcel")])):
        train = _write(tmp_path / f"{name}.csv", _rows(4) + extra)
        data = {"task": "classification", "labels": LABELS}
        result, out = train_tiny(tmp_path, tiny_model_dir, train, signing_key, name=name, data=data,
                                 privacy={"num_units": 38})  # fmt: skip
        assert result.exit_code == 0, result.output
        log = out.with_name(out.name + ".private") / "train.log"
        outputs[name] = (result.output.replace(str(out), "OUT"), log.read_text())
    assert "label outside the declared set" not in outputs["d"][1]
    assert "data: 2 of 38 training records have a label outside the declared set (3 labels)" in outputs["d2"][1]
    assert "outside the declared set" not in outputs["d2"][0]
    # the public lines are equal but for the synthetic step's timing (public: no record is read for it)
    public = [[x for x in o.splitlines() if not x.startswith("estimate:")] for o, _ in outputs.values()]
    assert public[0] == public[1] and any(x.startswith("done: 3/3 steps") for x in public[0])
