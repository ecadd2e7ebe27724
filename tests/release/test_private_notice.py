"""Off a terminal (piped stderr, ``CI=true``) ``train`` and ``eval`` say where the private diagnostics are in one
fixed line: the same bytes on neighbouring datasets, with none of the private numbers beside it."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import yaml
from conftest import ROW_PRIVACY
from typer.testing import CliRunner

from dplora.cli.app import app

NOTICE = "private diagnostics ("


def _world(folder: Path, model_dir: Path, key: Path, columns: list[str], rows: list[dict]) -> dict:
    """``train`` then ``eval`` in ``folder`` (relative paths: both worlds print the same names); their outputs."""
    folder.mkdir()
    with open(folder / "data.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    contract = {
        "privacy": {
            **ROW_PRIVACY,
            "accountant": "rdp",
            "num_units": 200,  # declared public N: the same in both worlds
        },
        "model": {"path": str(model_dir)},
        "data": {"path": "data.csv", "prompt_column": "message", "response_column": "reply", "eval_fraction": 0.2},
        "lora": {"r": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]},
        "training": {
            "expected_batch_size": 8,
            "physical_batch_size": 4,
            "steps": 2,
            "lr": 0.01,
            "max_seq_len": 48,
            "seed": 0,
            "output_dir": "run",
            "threads": 1,
        },
    }
    (folder / "contract.yaml").write_text(yaml.safe_dump(contract))
    env = {"CI": "true", "DPLORA_SHOW_PRIVATE": ""}
    runner = CliRunner()
    outputs = {}
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        for name, args in (
            ("train", ["train", "contract.yaml", "--signing-key", str(key), "--no-progress"]),
            ("eval", ["eval", "run"]),
        ):
            result = runner.invoke(app, args, env=env)
            assert result.exit_code == 0, (name, result.stdout, result.stderr, result.exception)
            outputs[name] = (result.stdout, result.stderr)
    finally:
        os.chdir(cwd)
    return outputs


def test_the_private_line_is_fixed_on_neighbours(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    with open(tickets_csv, newline="") as fh:
        reader = csv.DictReader(fh)
        columns, rows = list(reader.fieldnames), list(reader)
    worlds = []
    for name, data in (("a", rows), ("b", rows[:-1])):  # D and D' = D minus one record, in the same folder
        outputs = _world(tmp_path / "world", tiny_model_dir, signing_key[0], columns, data)
        worlds.append((outputs, tmp_path / name))
        shutil.move(tmp_path / "world", tmp_path / name)

    for command in ("train", "eval"):
        lines = [[x for x in out[command][1].splitlines() if x.startswith(NOTICE)] for out, _ in worlds]
        assert len(lines[0]) == 1 and lines[0] == lines[1], (command, lines)
        assert "--show-private" in lines[0][0]
    assert worlds[0][0]["train"][1].splitlines()[-1] == (
        "private diagnostics (held-out numbers, data notes; NOT covered by DP): run.private/train.log; "
        "--show-private prints them"
    )
    assert "run.private/eval.json" in [x for x in worlds[0][0]["eval"][1].splitlines() if x.startswith(NOTICE)][0]

    for outputs, folder in worlds:  # the held-out numbers are in the private folder, and only there
        report = json.loads((folder / "run.private" / "eval.json").read_text())
        numbers = {f"{v:.4f}" for part in ("base", "adapter") for v in report[part].values() if isinstance(v, float)}
        assert numbers
        printed = "".join(a + b for a, b in outputs.values())
        assert not [n for n in numbers if n in printed]
        private_lines = (folder / "run.private" / "train.log").read_text().splitlines()
        assert private_lines and not [x for x in private_lines if x in printed]


def test_the_readme_tour_says_where_private_numbers_go_off_a_terminal():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    tour = " ".join(readme.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0].split())
    assert "`private diagnostics (…)`" in tour and "--show-private" in tour
