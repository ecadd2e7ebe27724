"""The Python API (docs/python.md): the documented example runs, it is the same on neighbouring datasets, it
returns public fields only, and bad input is the CLI's named error with the CLI's message."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import contract_dict, write_contract
from typer.testing import CliRunner

import dplora
from dplora.cli.app import app
from dplora.ledger.store import Ledger

ROOT = Path(__file__).resolve().parents[3]


def _example() -> str:
    """The end-to-end example of docs/python.md (its one python block)."""
    (block,) = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "python.md").read_text(), re.S)
    return block


def _workspace(folder: Path, model: Path, rows: list[str], signing_key) -> Path:
    """A folder holding what the example names: contract.yaml (the tiny model), tickets.csv, ci.key, ci.pub."""
    folder.mkdir(parents=True)
    (folder / "tickets.csv").write_text("\n".join(rows) + "\n")
    raw = contract_dict(model, folder / "unused.csv", folder / "run", privacy={"num_units": 200})
    raw["data"]["path"] = "unused.csv"  # the example overrides it with data.path=tickets.csv
    raw["training"]["output_dir"] = "run"
    write_contract(folder / "contract.yaml", raw)
    shutil.copy(signing_key[0], folder / "ci.key")
    shutil.copy(signing_key[1], folder / "ci.pub")
    (folder / "ci.key").chmod(0o600)
    return folder


def _run_example(folder: Path, ledger: Path) -> dict:
    """Run the docs' example in ``folder`` in a fresh interpreter; its namespace's public results as JSON."""
    code = (
        _example()
        + "\nimport json, sys\n"
        + "print('RESULT' + json.dumps({'repr': repr(release), 'report': {k: report[k] for k in "
        + "('steps', 'noise_multiplier', 'epsilon')}, 'steps': steps, 'private': repr(private)}))\n"
    )
    env = {"PYTHONPATH": str(ROOT), "DPLORA_LEDGER": str(ledger), "DPLORA_CACHE_DIR": str(folder / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=600, env={**env, "CI": "true"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {"stdout": done.stdout, "stderr": done.stderr, **json.loads(done.stdout.rsplit("RESULT", 1)[1])}


def _masked(text: str, folder: Path) -> str:
    return re.sub(r"\b[0-9a-f]{32}\b", "<run_id>", text.replace(str(folder), "<folder>"))


def test_the_documented_example_is_the_same_on_neighbouring_datasets(tmp_path, tiny_model_dir, signing_key):
    """The example of docs/python.md on D and on D' (one ticket fewer): the returned Release's repr, the plan, the
    progress steps, what it printed and the ledger's charge are identical once the run id and folder are masked."""
    from dplora.data.demo import write_tickets

    write_tickets(tmp_path / "all.csv", num_tickets=60, seed=3, max_turns=1)
    rows = (tmp_path / "all.csv").read_text().splitlines()
    seen = []
    for name, keep in (("d", rows), ("d-prime", rows[:-1])):
        folder = _workspace(tmp_path / name, tiny_model_dir, keep, signing_key)
        out = _run_example(folder, folder / "ledger.sqlite3")
        (charge,) = Ledger(folder / "ledger.sqlite3").unassigned()
        seen.append(
            {
                "repr": _masked(out["repr"], folder),
                "report": out["report"],
                "steps": out["steps"],
                "printed": _masked(out["stdout"].rsplit("RESULT", 1)[0], folder),
                "stderr": _masked(out["stderr"], folder),
                "charge": (charge.status, str(charge.epsilon), str(charge.delta)),
                "private": _masked(out["private"], folder),
            }
        )
    assert seen[0] == seen[1]
    assert "Release(run_id='<run_id>', path=PosixPath('<folder>/run')" in seen[0]["repr"]
    assert seen[0]["stderr"] == ""  # nothing printed unless asked
    assert "not shown" in seen[0]["private"] and seen[0]["charge"][0] == "settled"


def test_train_returns_public_fields_only_and_the_private_report_says_so(tmp_path, tiny_model_dir, signing_key):
    """The Release has exactly the public fields; the private report is reached only by name and never shows its
    values in its repr."""
    import dataclasses

    data = {"eval_fraction": 0.25}
    raw = contract_dict(tiny_model_dir, tmp_path / "d.csv", tmp_path / "run", privacy={"num_units": 200}, data=data)
    from dplora.data.demo import write_tickets

    write_tickets(tmp_path / "d.csv", num_tickets=40, seed=1, max_turns=1)
    lines = []
    release = dplora.train(
        raw, signing_key=signing_key[0], ledger=tmp_path / "l.sqlite3", on_line=lines.append, threads=1
    )
    fields = {f.name for f in dataclasses.fields(release)}
    assert fields == {
        "run_id", "path", "differentially_private", "epsilon", "delta", "target_epsilon", "accountant", "steps",
        "num_units", "sample_rate", "noise_multiplier", "max_grad_norm", "attack_ceiling", "summary",
    }  # fmt: skip
    private_words = ("empty", "seconds", "peak", "records_zeroed", "loss")
    assert not any(w in json.dumps(release.summary) for w in private_words)
    assert any(line.startswith("device:") for line in lines)  # the public lines went to on_line
    assert release.attack_ceiling and set(release.attack_ceiling) == {"0.1%", "1%", "10%"}
    private = dplora.private_report(release)
    assert "empty_steps" in private.values and "not shown" in repr(private)
    # the held-out numbers training wrote privately are in the report too, as `dplora eval --json` gives them
    held = private.values["eval"]
    assert held["adapter"]["loss"] > 0 and held["base"]["loss"] > 0 and held["base"]["records"] > 0
    checked = dplora.verify(release.path, public_key=signing_key[1])
    assert checked.ok and checked.claims["epsilon"] == release.epsilon and checked.differentially_private


@pytest.mark.parametrize(
    ("contract", "overrides", "error", "needle"),
    [
        (42, (), dplora.BadInputError, "contract: a path, YAML text, a mapping or a Contract, not int"),
        ("missing.yaml", (), dplora.BadInputError, "contract file not found: missing.yaml"),
        ("privacy: [\n", (), dplora.BadInputError, "is not valid YAML"),
    ],
)
def test_bad_input_is_the_named_error(contract, overrides, error, needle):
    with pytest.raises(error, match=re.escape(needle)) as info:
        dplora.budget(contract, overrides)
    assert info.value.exit_code == 2 and info.value.__suppress_context__


def test_an_unknown_key_is_the_clis_message(tmp_path, tiny_model_dir, tickets_csv):
    """The same one line as `dplora budget` for an unknown override key."""
    cfg = write_contract(tmp_path / "c.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp_path / "run"))
    with pytest.raises(dplora.BadInputError) as info:
        dplora.budget(cfg, ["training.lrr=1e-3"])
    cli = CliRunner().invoke(app, ["budget", str(cfg), "training.lrr=1e-3"])
    assert cli.exit_code == 2 and f"error: {info.value}" in cli.output


def test_import_dplora_is_light_and_help_shows_typed_arguments():
    code = "import sys, dplora; import pydoc; t = pydoc.render_doc(dplora.train); print('torch' in sys.modules, t)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "signing_key: 'str | os.PathLike | None'" in done.stdout and "-> 'Release'" in done.stdout
