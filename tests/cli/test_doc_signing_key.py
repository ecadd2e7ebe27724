"""Every command in the README and docs/ that signs (train, sweep, synth, export) names ``--signing-key``: pasted as
written, one without it stops at ``no signing key`` (exit 2)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
TABLE_SYNOPSIS = re.compile(r"^\| `[^`]*`", re.M)  # docs/commands.md's synopsis column: its options are listed beside
SIGNING = re.compile(r"(?:^|[\s(])(?:-m )?dplora (?:train|sweep|synth|export) +(?![-\[{])\S")
# Spans that name a signing command without being one to paste, each with why.
NOT_COMMANDS = {
    "dplora train contract.yaml",  # the README's first sentence: what train reads
    "dplora train c.yaml --lr 1e-3",  # an error example: the unknown option's refusal
    "No such option: --lr; use the override training.lr=…: dplora train CONTRACT.yaml training.lr=…",  # its message
    "the contract is the first argument: dplora train CONTRACT.yaml",  # the same, for --config
    "training.lr is a contract key, set when training: dplora train CONTRACT.yaml training.lr=…",  # --lr on eval
    "dplora synth RUN --format messages",  # names one option of synth
}


def _commands(text: str):
    """Each fenced code line (backslash continuations joined) and each inline code span, whitespace collapsed."""
    for block in FENCE.findall(text):
        yield from (" ".join(line.split()) for line in block.replace("\\\n", " ").splitlines())
    prose = TABLE_SYNOPSIS.sub("", FENCE.sub("", text))
    yield from (" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose))


def _unsigned() -> list[str]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for command in _commands(path.read_text(encoding="utf-8")):
            if SIGNING.search(command) and "--signing-key" not in command and command not in NOT_COMMANDS:
                found.append(f"{path.relative_to(ROOT)}: {command}")
    return found


def test_every_documented_signing_command_names_the_key():
    assert _unsigned() == []


def test_the_scan_finds_a_command_without_the_key():
    text = "Run `dplora train my.yaml training.lr=1e-3` then\n```bash\ndplora sweep c.yaml \\\n  --out d\n```\n"
    found = [c for c in _commands(text) if SIGNING.search(c)]
    assert found == ["dplora sweep c.yaml --out d", "dplora train my.yaml training.lr=1e-3"]
