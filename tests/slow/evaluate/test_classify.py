"""The slow tier of tests/evaluate/test_classify.py, whose docstring describes the module."""

from __future__ import annotations

import json

import pytest
from conftest import INTENT_LABELS as LABELS
from conftest import intent_rows as _rows
from conftest import train_tiny
from conftest import write_intents as _write
from support.classify import build_files, runner

from dplora.cli.app import app

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return build_files(tmp_path_factory)


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
    got = doc["classification"]
    assert got["calibration"] == "none"  # the default: the headline is the per-token score, calibrated beside
    for m in ("base", "adapter"):
        assert got[m]["accuracy"] == got[m]["accuracy_uncalibrated"] is not None
        assert got[m]["accuracy_calibrated"] is not None
    text = runner.invoke(app, ["eval", str(out), "--show-private"])
    line = next(x for x in text.output.splitlines() if "classification over" in x)
    a, b = got["adapter"], got["base"]
    assert "3 declared labels, per token, uncalibrated: " in line
    assert f"adapter {a['accuracy']:.3f} (calibrated: base {b['accuracy_calibrated']:.3f}, adapter " in line

    run = read_run(out)
    model, tokenizer, device = load_adapter_model(run, threads=1, log=lambda _: None)
    prompts = ["my card was stolen #0", "where is my parcel #0"]
    bias, scores = classify(model, tokenizer, prompts, LABELS, run.contract.data, run.contract.training, device=device)
    key = ["--public-key", str(signing_key[1])]
    for prompt, s in zip(prompts, scores, strict=True):
        want = choose(LABELS, s, None)  # data.calibration absent: ranked uncalibrated, as the eval's headline
        assert bias  # the bias is computed (for the calibrated column) and not subtracted here
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
