"""Finding a moved release's files without a model load: the order (given, from here, beside the run folder), the
held-out file, a record without a data digest and a packaged model (dplora.release.locate)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from conftest import contract_dict

from dplora.contract.loader import parse_contract
from dplora.errors import BadInputError
from dplora.release.locate import ReleaseInputs, locate_inputs
from dplora.release.read import ReleasedRun


def _run(root: Path, predicate: dict, **sections) -> ReleasedRun:
    """A run folder ``root/train/run`` holding only a release envelope with ``predicate`` (nothing is verified)."""
    folder = root / "train" / "run"
    folder.mkdir(parents=True)
    statement = {"predicate": predicate}
    payload = base64.b64encode(json.dumps(statement).encode()).decode()
    (folder / "release.dsse.json").write_text(json.dumps({"payload": payload}))
    raw = contract_dict(Path("model"), Path("data/d.csv"), Path("run"), privacy={"num_units": 100}, **sections)
    return ReleasedRun(folder=folder, contract=parse_contract(raw), differentially_private=True)


def test_the_contract_s_path_from_here_comes_before_beside_the_run_folder(tmp_path, monkeypatch):
    run = _run(tmp_path, {})
    beside = tmp_path / "train" / "data" / "d.csv"
    beside.parent.mkdir()
    beside.write_text("message,reply\na,b\n")
    monkeypatch.chdir(tmp_path)
    lines = []
    found = locate_inputs(run, data=True, model=False, log=lines.append)
    assert Path(found.contract.data.path) == beside.resolve() and lines == []  # no digest recorded: nothing said
    assert run.contract.data.path == "data/d.csv"  # the run read is unchanged
    here = tmp_path / "data" / "d.csv"
    here.parent.mkdir()
    here.write_text("message,reply\nc,d\n")
    assert locate_inputs(run, data=True, model=False).contract.data.path == "data/d.csv"  # as typed, from here


def test_a_record_without_a_data_digest_takes_data_unchecked_in_one_note(tmp_path, monkeypatch):
    run = _run(tmp_path, {"data": {"digest": {"algorithm": None, "keyed": False, "files": {}}}})
    given = tmp_path / "given.csv"
    given.write_text("message,reply\na,b\n")
    monkeypatch.chdir(tmp_path)
    lines = []
    found = locate_inputs(run, ReleaseInputs(data=given), data=True, model=False, log=lines.append)
    assert found.contract.data.path == str(given)
    assert lines == [f"note: the release records no data digest (trained without a data key): --data {given} is "
                     "not checked"]  # fmt: skip


def test_the_held_out_file_is_found_beside_the_run_folder_or_named(tmp_path, monkeypatch):
    run = _run(tmp_path, {}, data={"eval_path": "data/held.csv"})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInputError) as err:
        locate_inputs(run, data=False, model=False, eval_file=True)
    assert str(err.value) == (
        "held-out file not found: data/held.csv (the path in the run's contract.yaml, relative to where it was "
        "trained); give --eval-path FILE"
    )
    held = tmp_path / "train" / "data" / "held.csv"
    held.parent.mkdir()
    held.write_text("message,reply\na,b\n")
    found = locate_inputs(run, data=False, model=False, eval_file=True)
    assert Path(found.contract.data.eval_path) == held.resolve()
    with pytest.raises(BadInputError, match="^--data: this command reads no training data here"):
        locate_inputs(run, ReleaseInputs(data=held), data=False, model=False, eval_file=True)


def test_model_is_for_a_model_path_run_only(tmp_path, monkeypatch):
    run = _run(tmp_path, {}, model={"path": None, "name": "smollm2-135m"})
    monkeypatch.chdir(tmp_path)
    assert locate_inputs(run, data=False).contract.model.name == "smollm2-135m"  # found by name, never looked for
    with pytest.raises(BadInputError, match=r"^--model: this run's base model is model.name=smollm2-135m, found by"):
        locate_inputs(run, ReleaseInputs(model=tmp_path), data=False)
