"""A release moved away from where it was trained: eval, synth and generate find its data and base model from
--data / --model (checked against the signed record's digests) or beside the run folder, and refuse in one line
what is missing or different.

One run is trained with relative paths (data/tickets.csv, model) inside its training folder; each test then works
from an empty folder elsewhere on a copy of the run alone, the data under another name and the model in another
folder.
"""

from __future__ import annotations

import base64
import csv
import json
import shutil
from pathlib import Path

import pytest
from conftest import moved_release
from typer.testing import CliRunner

from dplora.cli.app import app

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")

PROMPT = ["--prompt", "my order never arrived", "--max-new-tokens", "6", "--json"]


@pytest.fixture(scope="module")
def moved(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    """(paths, the eval --json numbers and the greedy reply where it was trained): :func:`conftest.moved_release`,
    plus a model with the same shapes and other weights as ``elsewhere/other-model``."""
    from tiny import save_tiny_model

    def at_home(runner):
        here = runner.invoke(app, ["eval", "run", "--json", "--show-private"])
        assert here.exit_code == 0, here.output
        reply = runner.invoke(app, ["generate", "run", "--public-key", str(signing_key[1]), *PROMPT])
        assert reply.exit_code == 0, reply.output
        return json.loads(here.output), json.loads(reply.output)["reply"]

    paths = moved_release(tmp_path_factory.mktemp("moved"), tiny_model_dir, tickets_csv, signing_key, at_home)
    save_tiny_model(paths["tmp"] / "elsewhere" / "other-model", seed=5)  # same shapes, other weights
    paths["other_model"] = paths["tmp"] / "elsewhere" / "other-model"
    numbers, reply = paths.pop("home")
    return paths, numbers, reply


@pytest.fixture
def elsewhere(moved, monkeypatch):
    """The module's paths, from the empty folder, with no data key in the environment."""
    paths, numbers, reply = moved
    monkeypatch.chdir(paths["cwd"])
    monkeypatch.delenv("DPLORA_DATA_KEY", raising=False)
    return paths, numbers, reply


def _one_line(result) -> str:
    """The one error line on stderr (``--json`` also writes the error as one JSON document on stdout)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    if result.stdout.strip():
        assert json.loads(result.stdout)["error"] == lines[0].removeprefix("error: ")
    return lines[0]


def _eval(run: Path, *extra: str):
    return runner.invoke(app, ["eval", str(run), "--json", "--show-private", "--threads", "1", *extra])


def _same_numbers(got: dict, numbers: dict) -> None:
    for model in ("base", "adapter"):
        assert got[model]["records"] == numbers[model]["records"] > 0
        assert got[model]["tokens"] == numbers[model]["tokens"]
        assert got[model]["loss"] == pytest.approx(numbers[model]["loss"], rel=1e-6)
    assert got["adapter"]["loss"] != got["base"]["loss"]


def test_eval_of_a_moved_release_names_the_option_to_give(elsewhere):
    paths, _, _ = elsewhere
    no_data = _eval(paths["run"])
    assert no_data.exit_code == 2
    line = _one_line(no_data)
    assert "data file not found: data/tickets.csv" in line and line.endswith("give --data FILE")
    assert "relative to where it was trained" in line
    no_model = _eval(paths["run"], "--data", str(paths["data"]), "--data-key", str(paths["key"]))
    assert no_model.exit_code == 2
    line = _one_line(no_model)
    assert "model not found: model.path=model" in line and line.endswith("give --model PATH")


def test_eval_with_data_and_model_gives_the_numbers_of_where_it_was_trained(elsewhere):
    paths, numbers, _ = elsewhere
    args = ["--data", str(paths["data"]), "--model", str(paths["model"]), "--data-key", str(paths["key"])]
    got = _eval(paths["run"], *args)
    assert got.exit_code == 0, got.output
    doc = json.loads(got.stdout)
    _same_numbers(doc, numbers)
    # the held-out set is named as trained: neither the given file's name nor its folder is written
    assert "renamed" not in got.output and "elsewhere" not in got.output
    assert "tickets.csv" in json.dumps(numbers)  # the contract's own name, as where it was trained
    saved = (paths["run"].parent / "run.private" / "eval.json").read_text()
    assert "renamed" not in saved and "elsewhere" not in saved


def test_eval_refuses_data_or_a_model_that_is_not_the_recorded_one(elsewhere, monkeypatch):
    paths, _, _ = elsewhere
    model = ["--model", str(paths["model"])]
    wrong = _eval(paths["run"], "--data", str(paths["other"]), "--data-key", str(paths["key"]), *model)
    assert wrong.exit_code == 2
    line = _one_line(wrong)
    assert line.endswith("does not match the release's data digest (another file, or another data key)")
    assert "reply" not in line and "order" not in line  # no cell of either file
    bad_key = paths["tmp"] / "other.key"
    bad_key.write_bytes(b"z" * 32)
    assert _eval(paths["run"], "--data", str(paths["data"]), "--data-key", str(bad_key), *model).exit_code == 2
    no_key = _eval(paths["run"], "--data", str(paths["data"]), *model)
    assert no_key.exit_code == 2 and "give --data-key PATH or set $DPLORA_DATA_KEY" in _one_line(no_key)
    monkeypatch.setenv("DPLORA_DATA_KEY", str(paths["key"]))  # the key from the environment, as verify reads it
    assert _eval(paths["run"], "--data", str(paths["data"]), *model).exit_code == 0
    other_model = _eval(paths["run"], "--data", str(paths["data"]), "--model", str(paths["other_model"]))
    assert other_model.exit_code == 2
    line = _one_line(other_model)
    assert "does not match the release's base model" in line and "model.safetensors" in line
    missing = _eval(paths["run"], "--data", str(paths["tmp"] / "nope.csv"), *model)
    assert missing.exit_code == 2 and _one_line(missing).endswith("nope.csv: no such file")


def test_relative_paths_are_found_beside_the_run_folder(elsewhere, moved):
    """A copy of the whole training folder works from anywhere; a different file there is refused when it can be
    checked (the key is given), naming --data."""
    paths, numbers, _ = elsewhere
    copy = paths["tmp"] / "copy"
    if not copy.exists():
        shutil.copytree(paths["trained"], copy, ignore=shutil.ignore_patterns("run.private"))
    plain = _eval(copy / "run")
    assert plain.exit_code == 0, plain.output
    _same_numbers(json.loads(plain.stdout), numbers)
    checked = _eval(copy / "run", "--data-key", str(paths["key"]))
    assert checked.exit_code == 0, checked.output
    swapped = paths["tmp"] / "swapped"
    if not swapped.exists():
        shutil.copytree(copy, swapped)
        shutil.copy(paths["other"], swapped / "data" / "tickets.csv")
    refused = _eval(swapped / "run", "--data-key", str(paths["key"]))
    assert refused.exit_code == 2
    line = _one_line(refused)
    assert "data found beside the run folder" in line and line.endswith("give --data FILE")


def test_synth_of_a_moved_release(elsewhere, signing_key):
    paths, _, _ = elsewhere
    prompts = paths["cwd"] / "public.csv"
    prompts.write_text("message\nMy order has not arrived\nCancel my plan\n")
    base = ["synth", str(paths["run"]), "--rows", "3", "--prompts", str(prompts), "--signing-key", str(signing_key[0])]
    base += ["--max-new-tokens", "4", "--seed", "3", "--threads", "1", "--json"]
    out = paths["cwd"] / "synthetic.csv"
    no_data = runner.invoke(app, [*base, "--out", str(out)])
    assert no_data.exit_code == 2 and _one_line(no_data).endswith("give --data FILE") and not out.exists()
    given = ["--model", str(paths["model"]), "--data-key", str(paths["key"])]
    wrong = runner.invoke(app, [*base, "--out", str(out), "--data", str(paths["other"]), *given])
    assert wrong.exit_code == 2 and "does not match the release's data digest" in _one_line(wrong)
    assert not out.exists()
    ok = runner.invoke(app, [*base, "--out", str(out), "--data", str(paths["data"]), *given])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert doc["rows"] == 3 and doc["differentially_private"] is True
    with open(out, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["message"] for r in rows] == ["My order has not arrived", "Cancel my plan", "My order has not arrived"]
    manifest = Path(doc["manifest"]).read_text()
    assert "renamed" not in manifest and "elsewhere" not in manifest and "renamed" not in ok.stdout
    check = runner.invoke(
        app, ["verify", str(paths["run"]), "--public-key", str(signing_key[1]), "--synthetic", str(out)]
    )
    assert check.exit_code == 0, check.output


def test_generate_from_a_moved_release(elsewhere, signing_key):
    paths, _, reply = elsewhere
    key = ["--public-key", str(signing_key[1])]
    no_model = runner.invoke(app, ["generate", str(paths["run"]), *key, *PROMPT])
    assert no_model.exit_code == 2
    assert _one_line(no_model).endswith("give --model PATH")  # --json: the error as one JSON line
    ok = runner.invoke(app, ["generate", str(paths["run"]), *key, *PROMPT, "--model", str(paths["model"])])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["reply"] == reply  # greedy: the reply of where it was trained
    wrong = runner.invoke(app, ["generate", str(paths["run"]), *key, *PROMPT, "--model", str(paths["other_model"])])
    assert wrong.exit_code == 2 and "does not match the release's base model" in _one_line(wrong)


def test_audit_attached_to_a_moved_release(elsewhere, signing_key):
    """The audit of a moved release reads the given data and model, checked as eval checks them; the attached
    section names the data file as trained, never the given file."""
    paths, _, _ = elsewhere
    run = paths["tmp"] / "audited" / "run"
    if not run.exists():  # a copy: attaching re-signs the record
        shutil.copytree(paths["run"], run)
    args = ["audit", str(run / "contract.yaml"), "--canaries", "8", "--candidates", "20", "--no-progress"]
    args += ["--threads", "1", "--attach", str(run), "--signing-key", str(signing_key[0])]
    given = ["--model", str(paths["model"]), "--data-key", str(paths["key"])]
    no_data = runner.invoke(app, [*args, "--out", str(paths["cwd"] / "a1")])
    assert no_data.exit_code == 2 and _one_line(no_data).endswith("give --data FILE")
    wrong = runner.invoke(app, [*args, "--out", str(paths["cwd"] / "a2"), "--data", str(paths["other"]), *given])
    assert wrong.exit_code == 2 and "does not match the release's data digest" in _one_line(wrong)
    assert not (paths["cwd"] / "a2").exists()
    ok = runner.invoke(app, [*args, "--out", str(paths["cwd"] / "a3"), "--data", str(paths["data"]), *given])
    assert ok.exit_code == 0, ok.output
    assert "attached to the release record" in ok.output
    statement = json.loads((run / "release.dsse.json").read_text())["payload"]
    section = json.loads(base64.b64decode(statement))["predicate"]["audit"]
    assert section["data"]["files"] == ["tickets.csv"] and section["data"]["source"] == "private"
    assert "renamed" not in json.dumps(section) and "elsewhere" not in json.dumps(section)
    check = runner.invoke(app, ["verify", str(run), "--public-key", str(signing_key[1])])
    assert check.exit_code == 0, check.output
    unattached = runner.invoke(app, ["audit", str(run / "contract.yaml"), "--data", str(paths["data"])])
    assert unattached.exit_code == 2
    assert "--data and --model stand in for the files of the release given with --attach" in _one_line(unattached)
