"""Red-team attacks on the Python API of eed765a (dplora/api.py, docs/python.md).

Each test is one attack on a claim of docs/python.md: the Release is public, nothing is printed unless asked,
on_progress gets public values only, private diagnostics come only through private_report, the ledger is charged
as by ``dplora train``, errors are the CLI's named classes and one-line messages (no record text, no private
count), and ``dplora.budget`` is public. Ten attacks broke a claim when this file was written (on_progress after a
resume, a str contract path inside the output folder, data refusals quoting record keys, bare TypeErrors, a missing
path with a ':', a key-permission warning printed): all fixed, and kept as plain tests. The one ``xfail`` is a
refusal the project keeps on purpose (the reason says why).
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
from conftest import contract_dict, write_contract
from typer.testing import CliRunner

import dplora
from dplora.cli.app import app

ROOT = Path(__file__).resolve().parents[3]
SECRET = "Jane Doe 078-05-1120"  # stands for private text inside one record of the training data
RUN_ID = re.compile(r"\b[0-9a-f]{32}\b")


def _masked(text: str, *folders: Path) -> str:
    for folder in folders:
        text = text.replace(str(folder), "<folder>")
    return RUN_ID.sub("<run_id>", text)


def _tickets(path: Path, num: int = 40, seed: int = 1) -> Path:
    from dplora.data.demo import write_tickets

    write_tickets(path, num_tickets=num, seed=seed, max_turns=1)
    return path


def _charges(ledger: Path) -> list[dict]:
    """Every charge and release row of a ledger, without what differs between any two runs (ids, times, paths)."""
    varying = {"run_id", "created_at", "settled_at", "output_dir", "record_sha256", "id"}
    with sqlite3.connect(ledger) as db:
        db.row_factory = sqlite3.Row
        rows = [dict(r) for r in db.execute("SELECT * FROM charges")]
        rows += [dict(r) | {"table": "releases"} for r in db.execute("SELECT * FROM releases")]
    return [{k: v for k, v in row.items() if k not in varying} for row in rows]


@pytest.fixture(scope="module")
def released(tmp_path_factory, tiny_model_dir, signing_key):
    """One release made by ``dplora.train`` from a contract file given as a str path (as docs/python.md does),
    with a data key and its own ledger."""
    folder = tmp_path_factory.mktemp("api-release")
    data = _tickets(folder / "tickets.csv")
    cfg = write_contract(
        folder / "contract.yaml",
        contract_dict(tiny_model_dir, data, folder / "unused", privacy={"num_units": 200}),
    )
    (folder / "data.key").write_bytes(b"k" * 32)
    release = dplora.train(
        str(cfg),
        [f"training.output_dir={folder / 'api-run'}"],
        signing_key=signing_key[0],
        data_key=folder / "data.key",
        ledger=folder / "api.sqlite3",
        threads=1,
    )
    return {"folder": folder, "cfg": cfg, "data": data, "release": release}


# --- claim 6: dplora.budget is public -------------------------------------------------------------------------


def test_budget_is_public_no_counted_n_no_unit_stats_and_equal_on_neighbours(tmp_path, tiny_model_dir):
    """HELD. Under add/remove without a declared N the API refuses (the counted N is private) with no count in the
    line; with N declared, the report has no records-per-unit statistics and no local data-count warning (40 rows
    under N=200 would give one on a terminal), and it is the same on D and D' (one unit removed)."""
    data = _tickets(tmp_path / "d.csv")
    raw = contract_dict(tiny_model_dir, data, tmp_path / "run", privacy={"num_units": None})
    with pytest.raises(dplora.BadInputError) as info:
        dplora.budget(raw)
    assert "num_units" in str(info.value) and not re.search(r"\d{2}", str(info.value))
    assert info.value.__suppress_context__

    rows = data.read_text().splitlines()
    reports = []
    for name, keep in (("d", rows), ("d-prime", rows[:-1])):
        (tmp_path / f"{name}.csv").write_text("\n".join(keep) + "\n")
        declared = contract_dict(tiny_model_dir, tmp_path / f"{name}.csv", tmp_path / "run", privacy={"num_units": 200})
        report = dplora.budget(declared)
        assert "not_covered_by_dp" not in report and "records_per_unit" not in json.dumps(report)
        assert report["warnings"] == []  # the local "fewer than half of privacy.num_units" check stays local
        reports.append(report)
    assert reports[0] == reports[1]


def test_budget_of_a_contract_object_with_overrides_is_the_files(tmp_path, tiny_model_dir):
    """HELD. A validated Contract plus overrides plans as the same contract written out with those overrides."""
    data = _tickets(tmp_path / "d.csv")
    raw = contract_dict(tiny_model_dir, data, tmp_path / "run", privacy={"num_units": 200})
    cfg = write_contract(tmp_path / "c.yaml", raw)
    overrides = ["training.lr=1e-3", "training.steps=4"]
    assert dplora.budget(dplora.load(raw), overrides) == dplora.budget(str(cfg), overrides)


# --- claim 5: errors are the CLI's named classes with the CLI's one-line messages ---------------------------------


@pytest.mark.parametrize("odd", ["tuple-key", "circular"])
def test_a_mapping_with_odd_types_is_a_bad_input_error(tmp_path, tiny_model_dir, odd):
    raw = contract_dict(tiny_model_dir, tmp_path / "d.csv", tmp_path / "run", privacy={"num_units": 200})
    if odd == "tuple-key":
        raw["training"][("lr", "schedule")] = "cosine"
    else:
        raw["privacy"]["again"] = raw["privacy"]
    with pytest.raises(dplora.BadInputError):
        dplora.budget(raw)


def test_a_missing_contract_path_with_a_colon_gets_the_clis_message():
    path = "configs/prod:v2.yaml"
    cli = CliRunner().invoke(app, ["budget", path])
    assert cli.exit_code == 2 and "contract file not found" in cli.output
    with pytest.raises(dplora.BadInputError) as info:
        dplora.budget(path)
    assert f"error: {info.value}" in cli.output


def test_verify_with_data_and_the_environments_data_key_passes_as_the_cli(released, signing_key, monkeypatch):
    monkeypatch.setenv("DPLORA_DATA_KEY", str(released["folder"] / "data.key"))
    path, data = released["release"].path, released["data"]
    cli = CliRunner().invoke(app, ["verify", str(path), "--public-key", str(signing_key[1]), "--data", str(data)])
    assert cli.exit_code == 0, cli.output
    checked = dplora.verify(path, public_key=signing_key[1], data=[data])
    assert checked.ok


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _bad_data(tmp_path: Path, tiny_model_dir: Path, case: str) -> dict:
    """A contract and a data file in which one record carries SECRET where the data reader quotes it."""
    if case == "missing-column":  # a typo in the contract; one record has a stray key holding private text
        rows = [{"message": f"m{i}", "reply": f"r{i}"} for i in range(20)]
        rows[5][SECRET] = "x"
        data = _jsonl(tmp_path / "d.jsonl", rows)
        return contract_dict(
            tiny_model_dir, data, tmp_path / "run", privacy={"num_units": 200}, data={"response_column": "answer"}
        )
    rows = [
        {"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": f"ok {i}"}]}
        for i in range(20)
    ]
    if case == "message-key":  # a turn written with the wrong keys by an exporter
        rows[7]["messages"][1] = {SECRET: "x"}
    else:  # a content part whose type field holds text
        rows[7]["messages"][1] = {"role": "assistant", "content": [{"type": SECRET, "text": "x"}]}
    data = _jsonl(tmp_path / "d.jsonl", rows)
    raw = contract_dict(tiny_model_dir, data, tmp_path / "run", privacy={"num_units": 200})
    raw["data"] = {"path": str(data)}
    return raw


@pytest.mark.parametrize("case", ["missing-column", "message-key", "content-part-type"])
def test_a_data_refusal_quotes_no_record_text(tmp_path, tiny_model_dir, signing_key, case):
    raw = _bad_data(tmp_path, tiny_model_dir, case)
    with pytest.raises(dplora.BadInputError) as info:
        dplora.train(raw, signing_key=signing_key[0], ledger=tmp_path / "l.sqlite3", threads=1)
    assert info.value.__suppress_context__
    assert SECRET[:8] not in str(info.value)


@pytest.mark.xfail(
    strict=True,
    reason="kept on purpose (docs/python.md, Errors): a refusal of the data names the rows to fix, and how many "
    "(positions, never contents); it is the operator's feedback, and it differs between neighbouring files",
)
def test_a_data_refusal_carries_no_private_count(tmp_path, tiny_model_dir, signing_key):
    rows = _tickets(tmp_path / "all.csv").read_text().splitlines()
    header = rows[0].split(",")
    blank = ",".join("" if name == "reply" else "x" for name in header)
    with_blanks = [rows[0], *rows[1:4], blank, *rows[4:9], blank, *rows[9:]]
    messages = []
    d_prime = [*with_blanks[:10], *with_blanks[11:]]  # the second record with an empty reply removed
    for name, keep in (("d", with_blanks), ("d-prime", d_prime)):
        data = tmp_path / f"{name}.csv"
        data.write_text("\n".join(keep) + "\n")
        raw = contract_dict(tiny_model_dir, data, tmp_path / "run", privacy={"num_units": 200})
        with pytest.raises(dplora.BadInputError) as info:
            dplora.train(raw, signing_key=signing_key[0], ledger=tmp_path / "l.sqlite3", threads=1)
        messages.append(str(info.value).replace(str(data), "<data>"))
    assert not any(re.search(r"\b\d+ empty cells", m) for m in messages), messages


def test_a_failed_training_step_is_one_clean_named_line(tmp_path, tiny_model_dir, signing_key, monkeypatch):
    """HELD. An out-of-memory or any library error in a step, whose text quotes a record, reaches the caller as
    TrainingFailedError (exit 4) whose line and printed traceback hold neither the record nor a count, raised from
    None. (Its ``__context__`` still holds the original exception object, hidden by ``__suppress_context__``.)"""
    import torch

    from dplora.run import checkpoint

    def boom(point, _step):
        if point == "loop-start":  # where the steps begin
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2 GiB for 17 records of {SECRET}")

    data = _tickets(tmp_path / "d.csv")
    raw = contract_dict(tiny_model_dir, data, tmp_path / "run", privacy={"num_units": 200})
    with pytest.raises(dplora.TrainingFailedError) as info, checkpoint.fault_hook(boom):
        dplora.train(raw, signing_key=signing_key[0], ledger=tmp_path / "l.sqlite3", threads=1)
    err = info.value
    assert err.exit_code == 4 and err.__suppress_context__ and err.__cause__ is None
    assert str(err).startswith("out of accelerator memory during training") and "\n" not in str(err)
    printed = "".join(traceback.format_exception(err))
    assert SECRET not in printed and "17 records" not in printed


# --- claim 2: nothing is printed unless asked ---------------------------------------------------------------------


def test_train_prints_nothing_unless_asked_with_a_readable_signing_key(tmp_path, signing_key):
    key = tmp_path / "ci.key"
    shutil.copy(signing_key[0], key)
    key.chmod(0o644)
    raw = contract_dict(tmp_path / "no-model", tmp_path / "d.csv", tmp_path / "run", privacy={"num_units": 200})
    code = (
        "import json, sys, dplora\n"
        f"raw = json.loads({json.dumps(json.dumps(raw))})\n"
        "try:\n"
        f"    dplora.train(raw, signing_key={str(key)!r}, ledger={str(tmp_path / 'l.sqlite3')!r})\n"
        "except dplora.BadInputError:\n"
        "    pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "" and done.stderr == ""


# --- claims 1-3: the same public output on neighbouring datasets -------------------------------------------------


def _held_out_neighbours(tmp_path: Path, tiny_model_dir: Path) -> tuple[list[dict], list[dict], dict]:
    """D and D' (one unit less) whose only difference is the one record that the keyed split holds out: D has a
    held-out set of one record (evaluated), D' an empty one (the evaluation is skipped, privately). Both hold a
    record longer than max_seq_len."""
    from dplora.contract.loader import parse_contract
    from dplora.data.units import load_table, split_eval

    with _tickets(tmp_path / "base.csv", num=40, seed=5).open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows.append({name: ("x" * 400 if name == "message" else "long") for name in rows[0]})
    _write_csv(tmp_path / "base.csv", rows)
    raw = contract_dict(
        tiny_model_dir, tmp_path / "base.csv", tmp_path / "run", privacy={"num_units": 200}, data={"eval_fraction": 0.1}
    )
    contract = parse_contract(copy.deepcopy(raw))
    train, held = split_eval(load_table(contract.data), contract.data, unit_key=None, seed=contract.training.seed)
    held_ids = set(held["ticket_id"])
    assert held_ids and train.num_rows > 20
    body = [r for r in rows if r["ticket_id"] not in held_ids]
    held_row = next(r for r in rows if r["ticket_id"] in held_ids)
    return [*body[:10], held_row, *body[10:]], body, raw


def _write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_the_release_and_everything_shown_are_the_same_on_neighbours_with_a_held_out_unit(
    tmp_path, tiny_model_dir, signing_key, monkeypatch, capfd
):
    """HELD. D' lacks the one held-out unit of D (so its held-out side is empty and the evaluation is skipped),
    both hold a record longer than max_seq_len, and $DPLORA_SHOW_PRIVATE=1 is set with CI unset: the Release
    (repr and summary), the on_line lines, the on_progress values, the private report's repr, the ledger charge
    and everything printed on stdout/stderr are identical once the run id and folder are masked; nothing is
    printed at all."""
    monkeypatch.setenv("DPLORA_SHOW_PRIVATE", "1")
    monkeypatch.delenv("CI", raising=False)
    d, d_prime, raw = _held_out_neighbours(tmp_path, tiny_model_dir)
    seen = []
    for name, rows in (("d", d), ("d-prime", d_prime)):
        folder = tmp_path / name
        folder.mkdir()
        _write_csv(folder / "data.csv", rows)
        contract = copy.deepcopy(raw)
        contract["data"]["path"] = str(folder / "data.csv")
        contract["training"]["output_dir"] = str(folder / "run")
        lines, steps = [], []
        release = dplora.train(
            contract,
            signing_key=signing_key[0],
            ledger=folder / "l.sqlite3",
            threads=1,
            on_line=lines.append,
            on_progress=lambda *values, steps=steps: steps.append(values),
        )
        out = capfd.readouterr()
        private = dplora.private_report(release)
        seen.append(
            {
                "repr": _masked(repr(release), folder),
                "summary": _masked(json.dumps(release.summary, sort_keys=True), folder),
                "fields": _masked(repr(dataclasses.asdict(release)), folder),
                "lines": [re.sub(r"[\d.]+ s", "<t> s", _masked(line, folder)) for line in lines],
                "progress": steps,
                "private": _masked(repr(private), folder),
                "charge": _charges(folder / "l.sqlite3"),
                "printed": (out.out, out.err),
            }
        )
        assert private.values["run_id"] == release.run_id  # the private report is there, only by name
    assert seen[0] == seen[1]
    assert seen[0]["printed"] == ("", "")
    logs = {name: (tmp_path / name / "run.private" / "train.log").read_text() for name in ("d", "d-prime")}
    assert "held-out evaluation skipped" in logs["d-prime"] and "held-out evaluation skipped" not in logs["d"]
    assert "held-out" in logs["d"]  # D's one held-out record was evaluated, privately


def test_the_release_holds_no_private_diagnostic(released):
    """HELD. The Release's fields and summary are the train --json fields and the attack ceiling; none of the
    private report's keys (realised empty steps, timings, peak memory, records zeroed) is among them, and the
    private report's repr shows no value."""
    release = released["release"]
    private = dplora.private_report(release)
    public_keys = set(release.summary) | {field.name for field in dataclasses.fields(release)}
    leaked = (set(private.values) - {"run_id", "note"}) & public_keys
    assert not leaked
    assert set(release.summary) == {
        "ok", "run_id", "differentially_private", "protected_unit", "unit_key", "adjacency", "num_units",
        "num_units_source", "expected_batch_size", "sample_rate", "steps", "steps_done", "noise_multiplier",
        "max_grad_norm", "epsilon_spent", "target_epsilon", "delta", "accountant", "accountant_version", "paths",
        "threads",
    }  # fmt: skip
    shown = repr(private)
    assert "not shown" in shown and not any(
        str(v) in shown for k, v in private.values.items() if k not in ("run_id",) and len(str(v)) > 2
    )


# --- claim 2: on_progress gets public values only ----------------------------------------------------------------


def _stopped_then_resumed(folder: Path, raw: dict, key: Path, stop_at: int) -> list[int]:
    """Train, send SIGINT from on_progress at step ``stop_at`` (a stop at wall-clock time lands on whatever step
    the private batches reached), then resume; the steps on_progress reports on the resumed run."""
    contract = copy.deepcopy(raw)
    contract["training"]["output_dir"] = str(folder / "run")

    def stop(step, _total, _eps):
        if step == stop_at:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        dplora.train(contract, signing_key=key, ledger=folder / "l.sqlite3", threads=1, on_progress=stop)
    steps: list[int] = []
    release = dplora.train(
        contract,
        signing_key=key,
        ledger=folder / "l.sqlite3",
        threads=1,
        resume=True,
        on_progress=lambda step, _total, _eps: steps.append(step),
    )
    assert release.steps == raw["training"]["steps"]
    return steps


def test_on_progress_does_not_reveal_where_a_resumed_run_stopped(tmp_path, tiny_model_dir, signing_key):
    data = _tickets(tmp_path / "d.csv")
    raw = contract_dict(
        tiny_model_dir, data, tmp_path / "unused", privacy={"num_units": 200}, training={"checkpoint_every": 1}
    )
    early = _stopped_then_resumed(tmp_path / "early", raw, signing_key[0], stop_at=1)
    late = _stopped_then_resumed(tmp_path / "late", raw, signing_key[0], stop_at=2)
    assert early == late, (early, late)


# --- claim 4: the ledger is charged exactly as by `dplora train` -------------------------------------------------


def test_the_ledger_charge_is_the_clis_for_the_same_contract(released, signing_key):
    """HELD. The same contract file, trained once by dplora.train (str path) and once by `dplora train`, leaves the
    same charge and release rows in their ledgers (run ids, times, folders and record digests aside)."""
    folder = released["folder"]
    cli = CliRunner().invoke(
        app,
        [
            "train",
            str(released["cfg"]),
            f"training.output_dir={folder / 'cli-run'}",
            "--signing-key",
            str(signing_key[0]),
            "--data-key",
            str(folder / "data.key"),
            "--ledger",
            str(folder / "cli.sqlite3"),
            "--threads",
            "1",
            "--no-progress",
        ],
    )
    assert cli.exit_code == 0, cli.output
    api_rows, cli_rows = _charges(folder / "api.sqlite3"), _charges(folder / "cli.sqlite3")
    assert api_rows == cli_rows and {r["status"] for r in api_rows if "status" in r} == {"settled"}


def test_a_contract_inside_the_output_folder_is_refused_and_uncharged_as_by_the_cli(released, signing_key, tmp_path):
    copy_dir = tmp_path / "previous-run"
    shutil.copytree(released["release"].path, copy_dir)
    contract = copy_dir / "contract.yaml"  # a release's own contract.yaml, to train it again
    override = f"training.output_dir={copy_dir}"
    base = ["--signing-key", str(signing_key[0]), "--threads", "1", "--no-progress", "--overwrite"]
    cli = CliRunner().invoke(app, ["train", str(contract), override, *base, "--ledger", str(tmp_path / "cli.sqlite3")])
    assert cli.exit_code == 2 and "contains the contract" in cli.output, cli.output
    try:
        dplora.train(
            str(contract),
            [override],
            signing_key=signing_key[0],
            ledger=tmp_path / "api.sqlite3",
            overwrite=True,
            threads=1,
        )
    except dplora.BadInputError as err:
        assert f"error: {err}" in cli.output
    api_charged = (tmp_path / "api.sqlite3").exists() and _charges(tmp_path / "api.sqlite3")
    assert not api_charged, api_charged
