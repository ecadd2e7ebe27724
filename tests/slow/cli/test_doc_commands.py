"""The slow tier of tests/cli/test_doc_commands.py, whose docstring describes the module."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from support.doc_commands import RUN, blocks

ROOT = Path(__file__).resolve().parents[3]


# Lines not run inside a block that runs, each with the reason.
SKIPPED_LINES = {"vllm serve": "needs vllm and a GPU"}


def _block(file: str, heading: str) -> str:
    found = [body for h, body in blocks((ROOT / file).read_text(encoding="utf-8")) if h == heading]
    assert len(found) == 1, f"{file}: expected one bash block under {heading!r}, found {len(found)}"
    return found[0]


def _substitute(body: str, model: Path) -> str:
    """The block with only the model replaced (the tiny folder), and skipped lines commented out."""
    body = re.sub(r'"\$\(\.venv/bin/python -c .*?\)/SmolLM2-135M-Instruct\.Q4_1\.gguf"', str(model), body)
    body = re.sub(r"\bBASE(_DIR)?\b", str(model), body)
    body = body.replace("my/llama-folder", str(model))
    lines = []
    for line in body.replace("\\\n", " ").splitlines():
        skip = [why for start, why in SKIPPED_LINES.items() if line.startswith(start)]
        lines.append(f"# skipped ({skip[0]}): {line}" if skip else line)
    return "\n".join(lines) + "\n"


def _demo_config(folder: Path, model: Path) -> None:
    """configs/demo.yaml with the model and the sizes replaced (2 steps, short records, 1 thread)."""
    raw = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    raw["model"] = {"path": str(model)}
    raw["lora"]["r"] = 2
    raw["training"].update(steps=2, max_seq_len=32, threads=1)
    (folder / "configs").mkdir(parents=True, exist_ok=True)
    (folder / "configs" / "demo.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))


def _run(folder: Path, script: str, monkeypatch) -> tuple[int, str]:
    """Run the script's lines in order in ``folder``: a simple ``dplora ...`` line in-process (the CLI's own entry,
    as the console script calls it: no interpreter start per line), any other line through bash. Returns (exit code
    of the first failing line or 0, the output)."""
    import os
    import shlex

    from typer.testing import CliRunner

    from dplora.cli.app import app

    monkeypatch.chdir(folder)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    py = sys.executable
    prelude = f'set -euo pipefail\ndplora() {{ "{py}" -m dplora "$@"; }}\npython() {{ "{py}" "$@"; }}\n'
    output = []
    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "dplora" and not any(c in line.split("#")[0] for c in "|&;$`<>()"):
            result = CliRunner().invoke(app, words[1:])
            code, text = result.exit_code, result.output
        else:
            done = subprocess.run(
                ["bash", "-c", prelude + line], cwd=folder, env=env, capture_output=True, text=True, timeout=900
            )
            code, text = done.returncode, done.stdout + done.stderr
        output.append(f"$ {line}\n{text}")
        if code != 0:
            return code, "\n".join(output)
    return 0, "\n".join(output)


def _own_data(folder: Path) -> None:
    """The README's own-data example: a jsonl file with `message` and `reply` fields (the user's file)."""
    import csv
    import json

    (folder / "my").mkdir(exist_ok=True)
    with open(folder / "demo" / "tickets.csv", newline="") as fh, open(folder / "my" / "tickets.jsonl", "w") as out:
        for row in list(csv.DictReader(fh))[:200]:
            out.write(json.dumps({"message": row["message"], "reply": row["reply"]}) + "\n")


def test_the_readme_and_docs_blocks_run_as_written(tmp_path, tiny_model_dir, monkeypatch):
    tour, fresh = tmp_path / "tour", tmp_path / "fresh"
    for folder in (tour, fresh):
        folder.mkdir()
        _demo_config(folder, tiny_model_dir)
    first_two = "\n".join(_block("README.md", "A five-minute tour").splitlines()[:2]) + "\n"
    done = []
    for file, heading, where in RUN:
        folder = tour if where == "tour" else fresh
        if heading == "Your own data and model":
            _own_data(folder)
        script = _substitute(_block(file, heading), tiny_model_dir)
        if where == "fresh":
            script = first_two + script
        code, output = _run(folder, script, monkeypatch)
        assert code == 0, f"{file} / {heading}: exit {code}\n{output}"
        done.append((file, heading, output))
    tour_out = done[0][2]
    assert "OK  signature" in tour_out and "OK  artifacts" in tour_out
    assert (tour / "demo" / "run" / "release.dsse.json").is_file()
    assert (tour / "my" / "run" / "release.dsse.json").is_file()
    assert (tour / "served" / "demo" / "dplora-export.dsse.json").is_file()
    assert (fresh / "served" / "demo" / "dplora-export.dsse.json").is_file()
    local = json.loads((fresh / "served" / "demo-peft" / "adapter_config.json").read_text())
    assert local["base_model_name_or_path"] == str(tiny_model_dir.resolve())  # what AutoPeft loaded from
    assert "OK  merge" in done[4][2] and "OK  base model" in done[3][2]
    shutil.rmtree(tmp_path, ignore_errors=True)
