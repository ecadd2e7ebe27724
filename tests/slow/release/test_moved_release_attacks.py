"""Attacks on releases that travel (dplora/release/locate.py, eval/synth/generate/audit --data/--model/--data-key).

A guarantee that holds is asserted as it holds; one that fails is asserted as it should hold and marked
``xfail(strict=True)`` with what was observed.

One run is trained with relative paths (data/tickets.csv, model) and a data key in ``trained/``; the attacks work on
a copy of the run alone (``moved/run``) from other folders.
"""

from __future__ import annotations

import base64
import csv
import json
import shutil
from pathlib import Path

import pytest
from conftest import moved_release
from support.error_line import ESC, one_error_line
from typer.testing import CliRunner

from dplora.cli.app import app

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def moved(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    """:func:`conftest.moved_release`, with the eval numbers where it was trained under ``numbers``."""

    def at_home(runner):
        here = runner.invoke(app, ["eval", "run", "--json", "--show-private", "--threads", "1"])
        assert here.exit_code == 0, here.output
        return json.loads(here.stdout)

    paths = moved_release(tmp_path_factory.mktemp("travel"), tiny_model_dir, tickets_csv, signing_key, at_home)
    paths["numbers"] = paths.pop("home")
    return paths


@pytest.fixture
def at(moved, monkeypatch):
    """The module's paths, working from the empty folder, with no data key in the environment."""
    monkeypatch.chdir(moved["cwd"])
    monkeypatch.delenv("DPLORA_DATA_KEY", raising=False)
    return moved


def _eval(run: Path, *extra: str):
    return runner.invoke(app, ["eval", str(run), "--json", "--show-private", "--threads", "1", *extra])


def _folder_with(root: Path, data_from: Path, model_from: Path) -> Path:
    """A folder holding data/tickets.csv (a copy of ``data_from``) and model/ (a copy of ``model_from``)."""
    if not root.exists():
        (root / "data").mkdir(parents=True)
        shutil.copy(data_from, root / "data" / "tickets.csv")
        shutil.copytree(model_from, root / "model")
    return root


def test_given_data_through_a_symlink_or_under_another_name_is_the_same_file(at):
    link = at["tmp"] / "link-to-data.csv"
    if not link.exists():
        link.symlink_to(at["data"])
    got = _eval(at["run"], "--data", str(link), "--data-key", str(at["key"]), "--model", str(at["model"]))
    assert got.exit_code == 0, got.output
    doc = json.loads(got.stdout)
    for model in ("base", "adapter"):
        assert doc[model]["loss"] == pytest.approx(at["numbers"][model]["loss"], rel=1e-6)
    assert "link-to-data" not in got.output and "renamed" not in got.output


def test_a_folder_or_a_missing_file_as_data_and_a_file_as_model_are_one_line_exit_2(at):
    key = ["--data-key", str(at["key"])]
    folder = _eval(at["run"], "--data", str(at["data"].parent), *key, "--model", str(at["model"]))
    assert folder.exit_code == 2 and one_error_line(folder).endswith(": no such file")
    weights = _eval(at["run"], "--data", str(at["data"]), *key, "--model", str(at["model"] / "config.json"))
    assert weights.exit_code == 2
    assert "is neither a folder nor a .gguf file" in one_error_line(weights)


def test_a_wrong_key_from_the_environment_refuses_the_trained_data(at, monkeypatch):
    wrong = at["tmp"] / "wrong.key"
    wrong.write_bytes(b"z" * 32)
    monkeypatch.setenv("DPLORA_DATA_KEY", str(wrong))
    got = _eval(at["run"], "--data", str(at["data"]), "--model", str(at["model"]))
    assert got.exit_code == 2
    assert one_error_line(got).endswith("does not match the release's data digest (another file, or another data key)")
    monkeypatch.setenv("DPLORA_DATA_KEY", str(at["tmp"] / "no-such.key"))
    missing = _eval(at["run"], "--data", str(at["data"]), "--model", str(at["model"]))
    assert missing.exit_code == 2
    one_error_line(missing)


def test_a_data_path_with_control_characters_or_private_text_stays_out_of_json_and_is_escaped(at):
    """A file name that holds a newline, an ANSI escape and private-looking text: the --json document of a run that
    reads it never names it; the refusal of another file under such a name is one escaped line."""
    name = "patient JOHN DOE hiv+\n\x1b[31mred.csv"
    same = at["tmp"] / name
    shutil.copy(at["data"], same)
    model = ["--model", str(at["model"]), "--data-key", str(at["key"])]
    ok = _eval(at["run"], "--data", str(same), *model)
    assert ok.exit_code == 0, ok.output
    assert "JOHN" not in ok.stdout and ESC not in ok.output
    saved = (at["run"].parent / "run.private" / "eval.json").read_text()
    assert "JOHN" not in saved
    shutil.copy(at["other"], same)
    refused = _eval(at["run"], "--data", str(same), *model)
    assert refused.exit_code == 2
    line = one_error_line(refused)
    assert "does not match the release's data digest" in line
    assert json.loads(refused.stdout)["error"] == line.removeprefix("error: ")


def test_data_found_from_here_is_checked_when_the_key_is_given(at, monkeypatch):
    here = _folder_with(at["tmp"] / "here-other", at["other"], at["model"])
    monkeypatch.chdir(here)
    got = _eval(at["run"], "--data-key", str(at["key"]))
    assert got.exit_code == 2, got.output  # observed: 0, held-out numbers of other rows
    assert "does not match the release's data digest" in one_error_line(got)


def test_data_found_beside_the_run_folder_without_a_key_is_said_to_be_unchecked(at):
    copy = at["tmp"] / "swapped-copy"
    if not copy.exists():
        shutil.copytree(at["trained"], copy, ignore=shutil.ignore_patterns("run.private"))
        shutil.copy(at["other"], copy / "data" / "tickets.csv")
    got = _eval(copy / "run")
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout)["base"]["records"] != at["numbers"]["base"]["records"]  # other rows were read
    assert "not checked" in got.stderr  # observed: nothing is said


def test_a_model_folder_with_an_extra_model_file_is_refused(at):
    extra = at["tmp"] / "base-with-template"
    if not extra.exists():
        shutil.copytree(at["model"], extra)
        (extra / "chat_template.jinja").write_text("{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}")
    got = _eval(at["run"], "--data", str(at["data"]), "--data-key", str(at["key"]), "--model", str(extra))
    assert got.exit_code == 2, got.output  # observed: 0, base loss differs from where it was trained
    assert "does not match the release's base model" in one_error_line(got)


def test_a_model_folder_missing_a_recorded_file_is_one_line_exit_2(at):
    partial = at["tmp"] / "base-without-generation-config"
    if not partial.exists():
        shutil.copytree(at["model"], partial, ignore=shutil.ignore_patterns("generation_config.json"))
    got = _eval(at["run"], "--data", str(at["data"]), "--data-key", str(at["key"]), "--model", str(partial))
    assert got.exit_code == 2
    line = one_error_line(got)
    assert "does not match the release's base model" in line and "generation_config.json is missing" in line


def test_a_model_found_from_here_with_other_weights_is_refused(at, signing_key, monkeypatch):
    from tiny import save_tiny_model

    here = at["tmp"] / "here-other-model"
    if not here.exists():
        save_tiny_model(here / "model", seed=5)  # same shapes, other weights
    monkeypatch.chdir(here)
    args = ["generate", str(at["run"]), "--public-key", str(signing_key[1]), "--prompt", "my order never arrived"]
    got = runner.invoke(app, [*args, "--max-new-tokens", "4", "--json"])
    assert got.exit_code == 2, got.output  # observed: 0 and a reply
    assert "does not match the release's base model" in one_error_line(got)


def test_audit_attach_refuses_other_data_found_from_here(at, signing_key, monkeypatch):
    run = at["tmp"] / "audited" / "run"
    if not run.exists():
        shutil.copytree(at["run"], run)
    here = _folder_with(at["tmp"] / "audit-here", at["other"], at["model"])
    monkeypatch.chdir(here)
    args = ["audit", str(run / "contract.yaml"), "--canaries", "8", "--candidates", "20", "--no-progress"]
    args += ["--threads", "1", "--attach", str(run), "--signing-key", str(signing_key[0])]
    got = runner.invoke(app, [*args, "--data-key", str(at["key"]), "--out", str(here / "audit")])
    statement = json.loads((run / "release.dsse.json").read_text())["payload"]
    predicate = json.loads(base64.b64decode(statement))["predicate"]
    assert "audit" not in predicate  # observed: a section with data.files ["tickets.csv"], source "private"
    assert got.exit_code == 2, got.output


@pytest.mark.xfail(
    strict=True,
    reason="kept on purpose (docs/audit.md): audit --attach --data FILE trains the audit's own working runs (in "
    "the audit folder, never shipped) on the file as given, so their records and cards name it; the attached "
    "section names the file as trained",
)
def test_audit_attach_with_given_data_names_no_given_file_in_the_audit_run(at, signing_key):
    run = at["tmp"] / "audited-given" / "run"
    if not run.exists():
        shutil.copytree(at["run"], run)
    folder = at["cwd"] / "audit-given"
    args = ["audit", str(run / "contract.yaml"), "--canaries", "8", "--candidates", "20", "--no-progress"]
    args += ["--threads", "1", "--attach", str(run), "--signing-key", str(signing_key[0]), "--out", str(folder)]
    args += ["--data", str(at["data"]), "--model", str(at["model"]), "--data-key", str(at["key"])]
    got = runner.invoke(app, args)
    assert got.exit_code == 0, got.output
    assert "renamed" not in got.output
    statement = json.loads((run / "release.dsse.json").read_text())["payload"]
    assert "renamed" not in base64.b64decode(statement).decode()  # the attached section: held
    assert "renamed" not in (folder / "audit.json").read_text()  # the report the section hashes: held
    audit_record = json.loads((folder / "run" / "release.dsse.json").read_text())["payload"]
    card = (folder / "run" / "adapter" / "README.md").read_text()
    assert "renamed" not in card  # observed: the audit run's card names `renamed.csv`
    assert "renamed" not in base64.b64decode(audit_record).decode()  # observed: data.files ["renamed.csv"]


def test_the_first_process_speaks_bad_input_in_one_line_without_record_text(at, monkeypatch):
    """Under a launcher (rank 0) a refusal of a moved release's data is one line naming no cell; rank 1 is
    silent."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "0")
    args = ["--data", str(at["other"]), "--data-key", str(at["key"]), "--model", str(at["model"])]
    first = _eval(at["run"], *args)
    assert first.exit_code == 2
    line = one_error_line(first)
    cells = [c for row in csv.reader(at["other"].open()) for c in row if len(c) > 6]
    assert not any(c in first.output for c in cells)
    assert "does not match the release's data digest" in line
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    other = _eval(at["run"], *args)
    assert other.exit_code == 2 and other.output == ""
