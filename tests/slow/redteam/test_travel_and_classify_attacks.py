"""Red team of releases that travel (dplora/release/locate.py, eval/synth/generate/audit --data/--model/--data-key),
of the classification path's public surface and of the quiet rules (quiet_worker, in_notebook).

A guarantee that holds is asserted as it holds; one that fails is asserted as it should hold and marked
``xfail(strict=True)`` with what was observed.

One run is trained with relative paths (data/tickets.csv, model) and a data key in ``trained/``; the attacks work on
a copy of the run alone (``moved/run``) from other folders.
"""

from __future__ import annotations

import base64
import csv
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import INTENT_LABELS as LABELS
from conftest import contract_dict, moved_release, train_tiny, write_contract
from conftest import intent_rows as _rows
from conftest import write_intents as _write
from typer.testing import CliRunner

from dplora.cli.app import app

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")
ESC = "\x1b"


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


def _one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert ESC not in result.output
    return lines[0]


def _folder_with(root: Path, data_from: Path, model_from: Path) -> Path:
    """A folder holding data/tickets.csv (a copy of ``data_from``) and model/ (a copy of ``model_from``)."""
    if not root.exists():
        (root / "data").mkdir(parents=True)
        shutil.copy(data_from, root / "data" / "tickets.csv")
        shutil.copytree(model_from, root / "model")
    return root


# --- 1. releases that travel -----------------------------------------------------------------------------------


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
    assert folder.exit_code == 2 and _one_line(folder).endswith(": no such file")
    weights = _eval(at["run"], "--data", str(at["data"]), *key, "--model", str(at["model"] / "config.json"))
    assert weights.exit_code == 2
    assert "is neither a folder nor a .gguf file" in _one_line(weights)


def test_a_wrong_key_from_the_environment_refuses_the_trained_data(at, monkeypatch):
    wrong = at["tmp"] / "wrong.key"
    wrong.write_bytes(b"z" * 32)
    monkeypatch.setenv("DPLORA_DATA_KEY", str(wrong))
    got = _eval(at["run"], "--data", str(at["data"]), "--model", str(at["model"]))
    assert got.exit_code == 2
    assert _one_line(got).endswith("does not match the release's data digest (another file, or another data key)")
    monkeypatch.setenv("DPLORA_DATA_KEY", str(at["tmp"] / "no-such.key"))
    missing = _eval(at["run"], "--data", str(at["data"]), "--model", str(at["model"]))
    assert missing.exit_code == 2
    _one_line(missing)


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
    line = _one_line(refused)
    assert "does not match the release's data digest" in line
    assert json.loads(refused.stdout)["error"] == line.removeprefix("error: ")


def test_data_found_from_here_is_checked_when_the_key_is_given(at, monkeypatch):
    here = _folder_with(at["tmp"] / "here-other", at["other"], at["model"])
    monkeypatch.chdir(here)
    got = _eval(at["run"], "--data-key", str(at["key"]))
    assert got.exit_code == 2, got.output  # observed: 0, held-out numbers of other rows
    assert "does not match the release's data digest" in _one_line(got)


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
    assert "does not match the release's base model" in _one_line(got)


def test_a_model_folder_missing_a_recorded_file_is_one_line_exit_2(at):
    partial = at["tmp"] / "base-without-generation-config"
    if not partial.exists():
        shutil.copytree(at["model"], partial, ignore=shutil.ignore_patterns("generation_config.json"))
    got = _eval(at["run"], "--data", str(at["data"]), "--data-key", str(at["key"]), "--model", str(partial))
    assert got.exit_code == 2
    line = _one_line(got)
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
    assert "does not match the release's base model" in _one_line(got)


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


# --- 2. classification -------------------------------------------------------------------------------------------


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
        train = _write(tmp_path / f"{name}-train.csv", _rows(4) + extra_train)
        held = _write(tmp_path / f"{name}-held.csv", _rows(1) + extra_held)
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
    train = _write(tmp_path / "train.csv", _rows(4))
    data = {"task": "classification", "labels": LABELS}
    result, out = train_tiny(tmp_path, tiny_model_dir, train, signing_key, data=data, privacy={"num_units": 36})
    assert result.exit_code == 0, result.output
    link = tmp_path / "labels.txt"
    link.hardlink_to(train)
    args = ["generate", str(out), "--prompt", "hi", "--no-verify", "--choices", f"@{link}"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "data.path (private data)" in _one_line(refused)
    assert "refund" not in refused.output


def test_choices_file_that_is_the_training_file_is_refused_from_another_folder(
    tmp_path, tiny_model_dir, signing_key, monkeypatch
):
    trained = tmp_path / "trained"
    (trained / "data").mkdir(parents=True)
    _write(trained / "data" / "train.csv", _rows(4))
    shutil.copytree(tiny_model_dir, trained / "model")
    monkeypatch.chdir(trained)
    data = {"task": "classification", "labels": LABELS}
    raw = contract_dict(Path("model"), Path("data/train.csv"), Path("run"), data=data, privacy={"num_units": 36})
    cfg = write_contract(trained / "contract.yaml", raw)
    trained_run = runner.invoke(app, ["train", str(cfg), "--no-progress", "--signing-key", str(signing_key[0])])
    assert trained_run.exit_code == 0, trained_run.output
    args = ["--prompt", "hi", "--no-verify", "--json"]
    here = runner.invoke(app, ["generate", "run", *args, "--choices", "@data/train.csv"])
    assert here.exit_code == 2 and "data.path (private data)" in _one_line(here)  # held from the training folder
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    got = runner.invoke(app, ["generate", str(trained / "run"), *args, "--choices", f"@{trained / 'data/train.csv'}"])
    assert "I want my money back #0" not in got.output  # observed: every training line is a key of "scores"
    assert got.exit_code == 2 and "data.path, beside the run folder (private data)" in _one_line(got)


# --- 3. quiet rules ----------------------------------------------------------------------------------------------


def test_the_first_process_speaks_bad_input_in_one_line_without_record_text(at, monkeypatch):
    """Under a launcher (rank 0) a refusal of a moved release's data is one line naming no cell; rank 1 is
    silent."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "0")
    args = ["--data", str(at["other"]), "--data-key", str(at["key"]), "--model", str(at["model"])]
    first = _eval(at["run"], *args)
    assert first.exit_code == 2
    line = _one_line(first)
    cells = [c for row in csv.reader(at["other"].open()) for c in row if len(c) > 6]
    assert not any(c in first.output for c in cells)
    assert "does not match the release's data digest" in line
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    other = _eval(at["run"], *args)
    assert other.exit_code == 2 and other.output == ""


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("badjson.jsonl", b'{"message": "hi", "reply": "ok"}\n{"message": "SECRETA", "reply": "SECRETB"\n'),
        ("dictval.jsonl", b'{"message": "hi", "reply": "ok"}\n{"message": {"SECRETC": "SECRETD"}, "reply": "x"}\n'),
        ("extra.csv", b"message,reply\nhi,ok\nSECRETE,SECRETF,SECRETG\n"),
        ("latin1.csv", b"message,reply\nhi,ok\nSECRETH\xff,ok\n"),
        ("quote.csv", b'message,reply\nhi,ok\n"SECRETI,ok\n'),
    ],
)
def test_a_bad_data_file_under_ci_is_one_line_naming_no_record_text(name, raw, tmp_path, tiny_model_dir, monkeypatch):
    """What the first process of a launcher prints for bad data (quiet_worker is False there, as in one process):
    one line, exit 2, no cell of the file."""
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("WORLD_SIZE", "1")
    data = tmp_path / name
    data.write_bytes(raw)
    cfg = write_contract(
        tmp_path / "c.yaml", contract_dict(tiny_model_dir, data, tmp_path / "o", privacy={"num_units": 10})
    )
    got = runner.invoke(app, ["train", str(cfg), "--no-progress"])
    assert got.exit_code == 2
    _one_line(got)
    assert "SECRET" not in got.output


@pytest.mark.parametrize(
    ("env", "notebook"),
    [
        ({"JPY_PARENT_PID": "123"}, True),
        ({"JPY_PARENT_PID": "  "}, False),
        ({"TERM": "xterm-color", "CLICOLOR": "1", "PAGER": "cat", "GIT_PAGER": "cat"}, True),
        ({"TERM": "xterm-color", "CLICOLOR": "1", "PAGER": "cat"}, False),
    ],
)
def test_a_kernel_child_never_echoes_private_lines_even_on_a_tty(env, notebook, monkeypatch):
    from dplora import surface

    for k in ("JPY_PARENT_PID", "TERM", "CLICOLOR", "PAGER", "GIT_PAGER", "CI", surface.SHOW_PRIVATE_ENV):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    class Tty:
        def isatty(self):
            return True

    assert surface.in_notebook() is notebook
    assert surface.echo_private(stream=Tty()) is (not notebook)
    assert surface.echo_private(stream=Tty(), as_json=True) is False
