"""Classification as a declared task: label ranking by length-normalised log-likelihood with contextual calibration
(Zhao et al. 2021), checked against a brute-force scorer; the calibration bias is the same on neighbouring held-out
sets; `generate --choices` chooses what the evaluation chooses; bad label sets exit 2 from the contract and file
identity alone."""

from __future__ import annotations

import csv

import pytest
import torch
from conftest import INTENT_LABELS as LABELS
from conftest import contract_dict, minimal_contract, write_contract
from support.classify import build_files, runner

from dplora.cli.app import app
from dplora.contract.loader import parse_contract

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return build_files(tmp_path_factory)


def _contract(tiny_model_dir, files, tmp_path, **data):
    train, held, labels = files
    data = {"eval_path": str(held), "task": "classification", "labels_file": str(labels), **data}
    return parse_contract(contract_dict(tiny_model_dir, train, tmp_path / "o", data=data, privacy={"num_units": 36}))


def _peft(tiny_model_dir):
    """The tiny Llama with LoRA adapters whose B is perturbed (seeded), so adapters and base differ."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.random.fork_rng():  # LoRA A's init draws from the global generator: seeded, the same in every test
        torch.manual_seed(3)
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
    gold = ["b", "b", "b", "zzz", "c"]
    got = classification_stats(labels, gold, scores, bias, min_records=2)
    assert got["calibration"] == "none"
    assert got["accuracy"] == got["accuracy_uncalibrated"] == pytest.approx(1 / 5)  # "zzz" is outside the set: wrong
    assert got["accuracy_calibrated"] == pytest.approx(3 / 5)  # b everywhere
    row = {"label": "b", "records": 3, "recall_uncalibrated": pytest.approx(1 / 3), "recall_calibrated": 1.0}
    assert got["per_label"] == [row | {"recall": pytest.approx(1 / 3)}]
    assert got["hidden"] == {"labels": 1, "records": 1, "min_records": 2}
    declared = classification_stats(labels, gold, scores, bias, calibration="contextual", min_records=2)
    assert declared["accuracy"] == pytest.approx(3 / 5) and declared["per_label"] == [row | {"recall": 1.0}]
    assert {k: v for k, v in declared.items() if k not in ("calibration", "accuracy", "per_label")} == {
        k: v for k, v in got.items() if k not in ("calibration", "accuracy", "per_label")
    }
    with pytest.raises(ValueError, match="'none' or 'contextual'"):
        classification_stats(labels, gold, scores, bias, calibration="calibrated")


@pytest.mark.parametrize("calibration", ["none", "contextual"])
def test_the_report_heads_with_the_declared_scoring_and_shows_both_recalls(calibration):
    from dplora.evaluate.classify import classification_stats
    from dplora.evaluate.report import classification_lines

    labels = ["a", "b"]
    scores = [[0.0, -1.0]] * 10 + [[-1.0, 0.0]] * 10  # uncalibrated: a for the first ten rows, b for the rest
    bias = [2.0, -2.0]  # calibrated: b everywhere
    gold = ["a"] * 10 + ["b"] * 10
    stats = classification_stats(labels, gold, scores, bias, calibration=calibration)
    c = {"calibration": calibration, "calibration_input": "N/A", "labels": 2, "records": 20, "out_of_set": 0}
    lines = classification_lines(c | {"base": stats, "adapter": stats})
    if calibration == "none":
        assert "2 declared labels, per token, uncalibrated: accuracy base 1.000, adapter 1.000 (calibrated: base " \
            "0.500, adapter 0.500)" in lines[0]  # fmt: skip
        assert lines[1].split() == ["label", "records", "recall", "base", "adapter", "calibrated", "base", "adapter"]
        assert lines[2].split() == ["a", "10", "1.000", "1.000", "0.000", "0.000"]
    else:
        want = "per token, calibrated on 'N/A': accuracy base 0.500, adapter 0.500 (uncalibrated: base 1.000"
        assert want in lines[0]
        assert lines[1].split()[-3:] == ["uncalibrated", "base", "adapter"]
        assert lines[2].split() == ["a", "10", "0.000", "0.000", "1.000", "1.000"]


@pytest.mark.parametrize("calibration", [None, "none", "contextual"])
def test_choose_labels_ranks_under_the_declared_calibration(tiny_model_dir, files, tmp_path, calibration):
    """``generate --choices`` ranks by the per-token score unless the contract declares contextual calibration;
    the scores checked against the brute-force scorer, on prompts where the two scorings disagree."""
    from tiny import byte_tokenizer

    from dplora.evaluate.classify import choose, choose_labels, classify

    extra = {} if calibration is None else {"calibration": calibration}
    contract = _contract(tiny_model_dir, files, tmp_path, **extra)
    model, tokenizer = _peft(tiny_model_dir), byte_tokenizer()
    prompts = ["I lost my card", "my card was stolen #0", "refund please", "hello"]
    bias, scores = classify(model, tokenizer, prompts, LABELS, contract.data, contract.training, device="cpu")
    contextual = calibration == "contextual"
    chosen = choose_labels(model, tokenizer, prompts, LABELS, contract.data, contract.training, device="cpu")
    for prompt, got, raw in zip(prompts, chosen, scores, strict=True):
        brute = [_brute_score(model, tokenizer, prompt, y) for y in LABELS]
        brute_bias = [_brute_score(model, tokenizer, "N/A", y) for y in LABELS]
        want = [r - b for r, b in zip(brute, brute_bias, strict=True)] if contextual else brute
        assert list(got.scores.values()) == pytest.approx(want, rel=1e-5, abs=1e-5)
        assert got == choose(LABELS, raw, bias if contextual else None)
    raw_pick = [choose(LABELS, s, None).label for s in scores]
    calibrated_pick = [choose(LABELS, s, bias).label for s in scores]
    assert raw_pick != calibrated_pick  # otherwise the test could not tell the scorings apart


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"task": "classification"}, "needs a declared label set"),
        ({"task": "classification", "labels": []}, "an empty label set"),
        ({"task": "classification", "labels": ["a", "a"]}, "repeats label 1"),
        ({"task": "classification", "labels": ["a" * 201]}, "at most 200"),
        ({"task": "classification", "labels": [f"l{i}" for i in range(1001)]}, "at most 1000"),
        ({"labels": ["a"]}, "needs data.task: classification"),
        ({"calibration": "contextual"}, "data.calibration needs data.task: classification"),
        ({"labels": ["a"], "calibration": "none"}, "data.labels, data.calibration need data.task: classification"),
        ({"task": "classification", "labels": ["a"], "calibration": "calibrated"}, "'none' or 'contextual'"),
        # an unquoted `yes` in YAML is a boolean: the line says so
        ({"task": "classification", "labels": ["a"], "calibration": True}, "unquoted yes, no, on or off"),
    ],
)
def test_bad_classification_keys_exit_2_from_the_contract(tmp_path, tiny_model_dir, files, data, needle):
    raw = contract_dict(tiny_model_dir, files[0], tmp_path / "o", data=data, privacy={"num_units": 36})
    result = runner.invoke(app, ["validate", str(write_contract(tmp_path / "c.yaml", raw))])
    assert result.exit_code == 2 and needle in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_default_contract_yaml_is_unchanged_by_the_task_keys(tmp_path, tiny_model_dir, files):
    """A generation contract's YAML (and so its digest and every release record) has none of the new keys."""
    raw = contract_dict(tiny_model_dir, files[0], tmp_path / "o", privacy={"num_units": 36})
    text = parse_contract(raw).to_yaml()
    assert not any(k in text for k in ("task:", "labels", "calibration"))
    classification = _contract(tiny_model_dir, files, tmp_path).to_yaml()
    assert "task: classification" in classification and "calibration:" not in classification  # digests kept
    assert "calibration: contextual" in _contract(tiny_model_dir, files, tmp_path, calibration="contextual").to_yaml()


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
