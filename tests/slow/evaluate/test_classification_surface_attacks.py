"""Attacks on the classification path's public surface: neighbouring data sets (one held-out record with an
undeclared label, one training record) give the same public outputs, and ``generate --choices`` never reads the
training file."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import INTENT_LABELS as LABELS
from conftest import contract_dict, intent_rows, train_tiny, write_contract, write_intents
from support.error_line import one_error_line
from typer.testing import CliRunner

from dplora.cli.app import app

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


_VOLATILE = re.compile(r"^estimate:|[0-9a-f]{64}|\d{4}-\d\d-\d\dT[\d:.+Z-]+")


def _public(text: str, out: Path) -> list[str]:
    """The lines of a public stream with the run's path, digests, timestamps and the timed estimate line masked."""
    text = text.replace(str(out), "OUT").replace(out.name, "NAME")
    return [_VOLATILE.sub("X", x) for x in text.splitlines() if not x.startswith("estimate:")]


def _strip_volatile(obj):
    if isinstance(obj, dict):
        return {
            k: _strip_volatile(v) for k, v in obj.items() if k not in ("started_at", "finished_at", "salt", "run_id")
        }
    if isinstance(obj, list):
        return [_strip_volatile(v) for v in obj]
    if isinstance(obj, str):
        return _VOLATILE.sub("X", obj)
    return obj


def test_classification_neighbours_with_a_private_held_out_set_have_the_same_public_output(
    tmp_path, tiny_model_dir, signing_key, monkeypatch
):
    """D and D' differ by one held-out record whose label is outside the declared set and one training record: the
    public stderr (CI=true), train --json and eval --json, exit code, record predicate (but timestamps, salts and
    digests) and the names of the files outside .private are the same; the held-out numbers only in .private."""
    monkeypatch.setenv("CI", "true")
    seen = {}
    for name, extra_train, extra_held in (
        ("nbrone", [], []),
        ("nbrtwo", [("parcel late #x", "late_parcel")], [("my card is gone", "not_a_declared_label")]),
    ):
        train = write_intents(tmp_path / f"{name}-train.csv", intent_rows(4) + extra_train)
        held = write_intents(tmp_path / f"{name}-held.csv", intent_rows(1) + extra_held)
        data = {"task": "classification", "labels": LABELS, "eval_path": str(held)}
        cfg = write_contract(
            tmp_path / f"{name}.yaml",
            contract_dict(tiny_model_dir, train, tmp_path / name, data=data, privacy={"num_units": 40}),
        )
        args = ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress", "--json"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        out = tmp_path / name
        statement = json.loads((out / "release.dsse.json").read_text())["payload"]
        predicate = json.loads(base64.b64decode(statement))["predicate"]
        files = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
        private = (out.parent / f"{name}.private" / "train.log").read_text()
        text = runner.invoke(app, ["eval", str(out), "--json"])
        assert text.exit_code == 0, text.output
        seen[name] = {
            "stdout": _strip_volatile(json.loads(result.stdout.replace(name, "NAME"))),
            "stderr": _public(result.stderr, out),
            "record": _strip_volatile(json.loads(json.dumps(predicate).replace(name, "NAME"))),
            "files": files,
            "eval_json": json.loads(text.stdout.replace(name, "NAME")),
            "private": private,
        }
    d, d2 = seen["nbrone"], seen["nbrtwo"]
    assert d["stdout"] == d2["stdout"] and d["stderr"] == d2["stderr"]
    assert d["files"] == d2["files"]
    assert d["eval_json"] == d2["eval_json"]
    assert set(d["record"]) == set(d2["record"])
    differing = [k for k in d["record"] if d["record"][k] != d2["record"][k]]
    assert differing in ([], ["subjects"], ["artifacts"]), differing  # adapter weights are DP outputs
    assert "1 of 37 training records have a label outside the declared set" in d2["private"]
    assert "outside the declared set" not in json.dumps(d2["stdout"]) + "\n".join(d2["stderr"])


def test_generate_choices_exit_code_and_output_do_not_follow_the_training_data(tmp_path, tiny_model_dir, signing_key):
    """generate --choices with a label set that holds a training record's text: the labels are what the caller
    typed (public), scored on the model only; a --choices @FILE that is a hard link of the data file is refused by
    identity before any byte is read."""
    train = write_intents(tmp_path / "train.csv", intent_rows(4))
    data = {"task": "classification", "labels": LABELS}
    result, out = train_tiny(tmp_path, tiny_model_dir, train, signing_key, data=data, privacy={"num_units": 36})
    assert result.exit_code == 0, result.output
    link = tmp_path / "labels.txt"
    link.hardlink_to(train)
    args = ["generate", str(out), "--prompt", "hi", "--no-verify", "--choices", f"@{link}"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "data.path (private data)" in one_error_line(refused)
    assert "refund" not in refused.output


def test_choices_file_that_is_the_training_file_is_refused_from_another_folder(
    tmp_path, tiny_model_dir, signing_key, monkeypatch
):
    trained = tmp_path / "trained"
    (trained / "data").mkdir(parents=True)
    write_intents(trained / "data" / "train.csv", intent_rows(4))
    shutil.copytree(tiny_model_dir, trained / "model")
    monkeypatch.chdir(trained)
    data = {"task": "classification", "labels": LABELS}
    raw = contract_dict(Path("model"), Path("data/train.csv"), Path("run"), data=data, privacy={"num_units": 36})
    cfg = write_contract(trained / "contract.yaml", raw)
    trained_run = runner.invoke(app, ["train", str(cfg), "--no-progress", "--signing-key", str(signing_key[0])])
    assert trained_run.exit_code == 0, trained_run.output
    args = ["--prompt", "hi", "--no-verify", "--json"]
    here = runner.invoke(app, ["generate", "run", *args, "--choices", "@data/train.csv"])
    assert here.exit_code == 2 and "data.path (private data)" in one_error_line(here)  # held from the training folder
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    got = runner.invoke(app, ["generate", str(trained / "run"), *args, "--choices", f"@{trained / 'data/train.csv'}"])
    assert "I want my money back #0" not in got.output  # observed: every training line is a key of "scores"
    assert got.exit_code == 2 and "data.path, beside the run folder (private data)" in one_error_line(got)
