"""Helpers shared by tests/contract/test_fuzz_boundary.py and its slow tier under tests/slow/."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import typer
from click.testing import CliRunner
from conftest import contract_dict, write_contract
from hypothesis import strategies as st

from dplora.cli.app import app
from dplora.errors import MAX_MESSAGE_CHARS

LONG = 300  # generated strings at least this long must never appear whole in a message


BASE = {
    "privacy": {
        "protected_unit": "user",
        "unit_key": "user_id",
        "adjacency": "add_remove",
        "target_epsilon": 8.0,
        "delta": 1e-5,
        "accountant": "rdp",
        "max_grad_norm": 1.0,
        "noise_multiplier": 2.0,
    },
    "model": {"path": "/nonexistent/model"},
    "data": {"path": "data.csv", "prompt_column": "message", "response_column": "reply"},
    "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    # q = 9/9 = 1: RDP has a closed form there, so a valid case costs milliseconds, not the accountant's seconds
    "training": {"expected_batch_size": 9, "steps": 5, "lr": 0.01, "output_dir": "out"},
}


# the keys a fuzzed section draws from: those BASE sets, then the optional ones it leaves out
KEYS = {section: sorted(values) for section, values in BASE.items()}
KEYS["privacy"] += ["num_units", "max_records_per_unit", "unit_clipping", "population", "sampling", "per_sample"]
KEYS["model"] += ["name", "dtype", "allow_tf32", "attn_implementation"]
KEYS["data"] += ["format", "text_column"]
KEYS["lora"] += ["dropout"]
KEYS["training"] += ["epochs", "physical_batch_size", "optimizer", "max_seq_len", "seed", "threads"]
KEYS["training"] += ["gradient_checkpointing"]


ODD_TEXT = ["", " ", "💥🔥", "\u202eevil", "a\nb", "a\x1bb", "null", "NaN", "~", "1e-3", "0x10", "1_000", "2001-13-45"]


ODD_NUMBERS = [0, -1, 2**63, 10**30, 1e300, 1e-300, 5e-324, -0.0, 1e-3, 9.99e-4, 1e4, 10000.5, 1e6, 1000000.1, 1e-7]


COMMAND = typer.main.get_command(app)  # built once: typer's CliRunner rebuilds it on every call (about 50 ms)


def invoke(args: list[str]):
    """Run ``dplora ARGS`` in-process, as the console script would (one-line errors, exit codes)."""
    return CliRunner().invoke(COMMAND, [str(a) for a in args])


scalars = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(ODD_NUMBERS),
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.sampled_from(ODD_TEXT),
    st.integers(min_value=LONG, max_value=3000).map(lambda n: "é" + "x" * n),
)


values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)


sections = st.sampled_from([*KEYS, "evaluation", ""])


def bomb(levels: int) -> str:
    """A "billion laughs": each anchor is a list of nine aliases of the one before (9**levels strings)."""
    lines = ["b0: &b0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            st_ = path.lstat()
            out[str(path.relative_to(folder))] = (st_.st_size, st_.st_mtime_ns)
    return out


def check_outcome(res, *, as_json: bool, inputs: list[str] = ()) -> int:
    """Exit 0 or 2, no traceback, one bounded error line; with ``--json`` exactly one JSON document on stdout."""
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code in (0, 2), (res.exit_code, res.output[-2000:])
    assert "Traceback" not in res.output
    lines = res.stderr.splitlines()
    if res.exit_code == 2:
        assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr[:2000]
        assert len(lines[0]) <= len("error: ") + MAX_MESSAGE_CHARS
        for value in inputs:  # a long input value is quoted as a short excerpt at most
            assert value not in lines[0], lines[0]
    else:
        assert not any(line.startswith("error") for line in lines), res.stderr[:2000]
    if as_json:
        doc = json.loads(res.stdout)  # exactly one document: any other output breaks the parse
        assert isinstance(doc, dict) and doc["ok"] is (res.exit_code == 0)
        if res.exit_code:
            assert doc["exit_code"] == 2 and doc["error"] == lines[0].removeprefix("error: ")
    elif res.exit_code == 2:
        assert res.stdout == ""
    return res.exit_code


def build_workdir(tmp_path, monkeypatch):
    """The working directory of the fuzzed commands: a contract, a 40-row data file; the ledger would go here."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPLORA_LEDGER", str(tmp_path / "ledger.sqlite3"))
    rows = [f"u{i % 9},question SECRET{i},answer SECRET{i}" for i in range(40)]
    (tmp_path / "data.csv").write_text("user_id,message,reply\n" + "\n".join(rows) + "\n")
    return tmp_path


TRAIN_CASES = {  # name: (contract sections, extra CLI arguments, data bytes or None, expected exit, stderr needle)
    "valid --json": ({}, ["--json"], None, 0, ""),
    "valid user-level": ({"privacy": {"protected_unit": "user", "unit_key": "customer_id"}}, [], None, 0, ""),
    "control --json": ({"privacy": {"enabled": False}}, ["--json"], None, 0, "NOT DIFFERENTIALLY PRIVATE"),
    "latin-1 data": ({}, [], b"ticket_id,customer_id,message,reply\nt1,c1,caf\xe9,ok\n", 2, "not UTF-8"),
    "ragged csv": ({}, [], b"ticket_id,customer_id,message,reply\nt1,c1,a,b,c\n", 2, "fields"),
    "missing unit key": ({"privacy": {"protected_unit": "user", "unit_key": "nope"}}, [], None, 2, "no column"),
    "zero-byte data": ({}, [], b"", 2, "no rows"),
    "empty reply": ({}, [], b"ticket_id,customer_id,message,reply\nt1,c1,hello,\n", 2, "empty cells"),
    "sigma 1e-300": ({"privacy": {"noise_multiplier": 1e-300}}, [], None, 2, "noise_multiplier"),
    "threads 1e30": ({"training": {"threads": 10**30}}, [], None, 2, "training.threads"),
    "--threads huge": ({}, ["--threads", "100000"], None, 2, "--threads"),
    "rank 1e9": ({"lora": {"r": 10**9}}, [], None, 2, "lora.r"),
    "unknown module, nested out": ({"lora": {"target_modules": ["nope"]}}, [], None, 2, "lora.target_modules"),
    "long output name": ({"training": {"output_dir": "o" * 300}}, [], None, 2, "output_dir"),
    "population, no ledger": ({"privacy": {"population": "tickets"}}, [], None, 2, "no ledger"),
    "missing signing key --json": ({}, ["--signing-key", "nope.key", "--json"], None, 2, "nope.key"),
    "unknown option": ({}, ["--foo=1"], None, 2, "No such option"),
    "delta 1": ({"privacy": {"delta": 1.0}}, [], None, 2, "privacy.delta"),
    "missing model": ({"model": {"path": "/nonexistent/model"}}, [], None, 2, "model not found"),
}


SLOW_TRAIN_CASES = ("valid --json", "valid user-level", "control --json")  # the runs that train and release


def run_train_case(case, tmp_path, monkeypatch, tiny_model_dir, train_data, signing_key):
    """At most 20 one-step runs: exit 0 with a verifiable release (and one JSON document), or exit 2 with nothing
    written (no output, partial or lock folder, no parent folders, no ledger)."""
    sections, extra, data, expected, needle = TRAIN_CASES[case]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPLORA_LEDGER", str(tmp_path / "ledger.sqlite3"))
    data_path = train_data
    if data is not None:
        data_path = tmp_path / "data.csv"
        data_path.write_bytes(data)
    out = "nested/deeper/out" if "nested" in case else "out"
    sections = {k: dict(v) for k, v in sections.items()}
    sections["training"] = {"steps": 1, "expected_batch_size": 4, **sections.get("training", {})}
    sections["privacy"] = {"noise_multiplier": 1.0, **sections.get("privacy", {})}  # σ given: no calibration time
    raw = contract_dict(tiny_model_dir, data_path, out, **sections)
    write_contract(tmp_path / "c.yaml", raw)
    before = snapshot(tmp_path)
    args = ["train", "c.yaml", "--signing-key", str(signing_key[0]), "--no-progress", *extra]
    res = invoke(args)
    check_outcome(res, as_json="--json" in extra)
    assert res.exit_code == expected, res.output[-2000:]
    assert needle in res.stderr, res.stderr
    if expected == 2:
        assert snapshot(tmp_path) == before, "train wrote something on exit 2"
        return
    folder = tmp_path / raw["training"]["output_dir"]
    assert (folder / "release.dsse.json").is_file()
    if case == "control --json":  # a non-private control: verify --json is intact but exits 6, in one document
        assert json.loads(res.stdout)["differentially_private"] is False
        check = invoke(["verify", str(folder), "--public-key", str(signing_key[1]), "--json"])
        report = json.loads(check.stdout)
        assert check.exit_code == 6 and report["ok"] is False and report["exit_code"] == 6
        assert report["differentially_private"] is False and "NOT DIFFERENTIALLY PRIVATE" in report["error"]
        assert [c["check"] for c in report["checks"]][:3] == ["key", "signature", "artifacts"]
    elif "--json" in extra:
        doc = json.loads(res.stdout)
        assert doc["steps_done"] == doc["steps"] == 1 and 0 < doc["epsilon_spent"] <= doc["target_epsilon"]
        assert doc["num_units"] == 30 and doc["sample_rate"] == pytest.approx(4 / 30)
        assert doc["delta"] == 1e-5 and doc["accountant"] == "rdp" and len(doc["run_id"]) == 32
        assert doc["paths"]["release"] == str(folder / "release.dsse.json")
        assert not {"seconds", "seconds_per_step", "eval_seconds", "empty_steps"} & set(doc)  # private (issue 40)
        check = invoke(["verify", str(folder), "--public-key", str(signing_key[1]), "--json"])
        assert check.exit_code == 0, check.output
        report = json.loads(check.stdout)
        assert report["ok"] is True and [c["check"] for c in report["checks"]][:3] == ["key", "signature", "artifacts"]
        assert report["claims"]["run_id"] == doc["run_id"]
        assert report["claims"]["epsilon_spent"] == pytest.approx(doc["epsilon_spent"])
        (folder / "adapter" / "adapter_config.json").write_text("{}")  # tamper: exit 3, still one JSON document
        bad = invoke(["verify", str(folder), "--public-key", str(signing_key[1]), "--json"])
        assert bad.exit_code == 3 and len(bad.stderr.splitlines()) == 1
        assert json.loads(bad.stdout) == {"ok": False, "exit_code": 3, "error": bad.stderr.strip()[len("error: ") :]}
