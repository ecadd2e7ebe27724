"""Item 1 of issue 8: --overwrite replaces only a folder a previous dplora run wrote; inputs always survive."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import contract_dict, train_contract, write_contract
from support.outputs import runner, workdir

from dplora.cli.app import app
from dplora.errors import BadInputError
from dplora.run import outputs


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("output_dir", "needle"),
    [
        ("WORK", "the working directory"),  # training.output_dir=$PWD
        (".", "the working directory"),  # was: exit 1 "unexpected ValueError"
        ("sub/..", "the working directory"),
        ("..", "the working directory"),
        ("data", "the data file"),  # the folder that holds data.path
    ],
)
def test_overwrite_never_touches_the_working_folder_or_the_data(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key, output_dir, needle
):
    """Exit 2 before any work; the contract, the data and both keys survive byte for byte."""
    work = workdir(tmp_path, monkeypatch, tickets_csv, signing_key)
    data = work / "tickets.csv"
    if output_dir == "data":
        (work / "data").mkdir()
        data = work / "data" / "tickets.csv"
        shutil.move(work / "tickets.csv", data)
    out = str(work) if output_dir == "WORK" else output_dir
    cfg = write_contract(work / "c.yaml", contract_dict(tiny_model_dir, data, Path(out)))
    before = _snapshot(tmp_path)
    result = train_contract(cfg, "signing.key", "--overwrite")
    assert result.exit_code == 2, result.output
    (line,) = result.output.splitlines()
    assert line.startswith("error: training.output_dir=") and needle in line
    assert _snapshot(tmp_path) == before  # nothing removed, nothing added (no .partial, no .lock)


@pytest.mark.parametrize(
    ("inside", "needle"), [("signing.key", "the signing key"), ("c.yaml", "the contract"), ("data.key", "the data key")]
)
def test_output_folder_holding_a_key_or_the_contract_is_refused(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key, inside, needle
):
    """A previous run's folder that also holds a key or the contract is refused even with --overwrite."""
    work = workdir(tmp_path, monkeypatch, tickets_csv, signing_key)
    run = work / "run"
    run.mkdir()
    (run / "release.dsse.json").write_text("{}")
    (work / "data.key").write_bytes(b"k" * 32)
    if inside != "c.yaml":
        shutil.copy(work / inside, run / inside)
    paths = {"signing.key": "run/signing.key", "c.yaml": "run/c.yaml", "data.key": "run/data.key"}
    cfg_path = work / paths["c.yaml"] if inside == "c.yaml" else work / "c.yaml"
    cfg = write_contract(cfg_path, contract_dict(tiny_model_dir, work / "tickets.csv", Path("run")))
    extra = ["--data-key", paths["data.key"]] if inside == "data.key" else []
    args = ["train", str(cfg), "--signing-key", paths["signing.key"] if inside == "signing.key" else "signing.key"]
    before = _snapshot(work)
    result = runner.invoke(app, [*args, "--no-progress", "--overwrite", *extra])
    assert result.exit_code == 2, result.output
    assert needle in result.output and len(result.output.splitlines()) == 1
    assert _snapshot(work) == before


def test_overwrite_refuses_a_folder_dplora_did_not_write(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    work = workdir(tmp_path, monkeypatch, tickets_csv, signing_key)
    (work / "notes").mkdir()
    (work / "notes" / "todo.txt").write_text("mine")
    cfg = write_contract(work / "c.yaml", contract_dict(tiny_model_dir, work / "tickets.csv", Path("notes")))
    result = train_contract(cfg, "signing.key", "--overwrite")
    assert result.exit_code == 2 and "has no release.dsse.json" in result.output, result.output
    assert (work / "notes" / "todo.txt").read_text() == "mine"
    assert not (work / "notes.partial").exists() and not (work / "notes.lock").exists()


def test_check_output_dir_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ok = outputs.check_output_dir("runs/a", overwrite=False, protected=[])
    assert ok == Path("runs/a")
    Path("runs/a").mkdir(parents=True)
    assert outputs.check_output_dir("runs/a", overwrite=False, protected=[]) == Path("runs/a")  # empty: fine
    (tmp_path / "runs/a/release.dsse.json").write_text("{}")
    with pytest.raises(BadInputError, match="pass --overwrite"):
        outputs.check_output_dir("runs/a", overwrite=False, protected=[])
    assert outputs.check_output_dir("runs/a", overwrite=True, protected=[]) == Path("runs/a")
    with pytest.raises(BadInputError, match="the ledger"):
        outputs.check_output_dir("runs", overwrite=True, protected=[("the ledger", Path("runs/a/x.sqlite3"))])


@pytest.mark.parametrize(
    ("files", "ok"),
    [
        ({".dplora-partial": "", "metrics.jsonl": ""}, True),  # an interrupted run
        ({"FAILED.json": "{}", "metrics.jsonl": ""}, True),  # a failed run from before the marker
        ({"thesis.tex": ""}, False),
        ({".dplora-partial": "", "thesis.tex": ""}, False),
    ],
)
def test_partial_folder_is_replaced_only_when_dplora_wrote_it(tmp_path, monkeypatch, files, ok):
    monkeypatch.chdir(tmp_path)
    staging = Path("run.partial")
    staging.mkdir()
    for name, text in files.items():
        (staging / name).write_text(text)
    if not ok:
        with pytest.raises(BadInputError, match="run.partial was not written by dplora"):
            outputs.check_output_dir("run", overwrite=True, protected=[])
        with pytest.raises(BadInputError):
            outputs.fresh_staging(Path("run"))
        assert (staging / "thesis.tex").exists()
        return
    outputs.check_output_dir("run", overwrite=False, protected=[])
    fresh = outputs.fresh_staging(Path("run"))
    assert sorted(p.name for p in fresh.iterdir()) == [".dplora-partial"]


def test_lock_file_with_content_is_not_ours(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("run.lock").write_text("my notes")
    with pytest.raises(BadInputError, match="run.lock exists and was not written by dplora"):
        outputs.check_output_dir("run", overwrite=False, protected=[])


def test_publish_keeps_files_that_appeared_during_the_run(tmp_path):
    out, staging = tmp_path / "run", tmp_path / "run.partial"
    out.mkdir()
    (out / "release.dsse.json").write_text("old")
    (out / "late.txt").write_text("keep")
    staging.mkdir()
    (staging / outputs.PARTIAL_MARKER).write_text("")
    (staging / "release.dsse.json").write_text("new")
    kept = outputs.publish(staging, out)
    assert (out / "release.dsse.json").read_text() == "new" and not (out / outputs.PARTIAL_MARKER).exists()
    assert kept is not None and (kept / "late.txt").read_text() == "keep"
    assert not staging.exists()
