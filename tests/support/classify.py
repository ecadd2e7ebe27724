"""Helpers shared by tests/evaluate/test_classify.py and its slow tier under tests/slow/."""

from __future__ import annotations

from conftest import INTENT_LABELS as LABELS
from conftest import intent_rows as _rows
from conftest import write_intents as _write
from typer.testing import CliRunner

runner = CliRunner()


def build_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cls")
    train = _write(tmp / "train.csv", _rows(4))  # 36 rows
    held = _write(tmp / "held.csv", [*_rows(1), ("my card is gone", "not_a_declared_label")])  # 10 rows
    labels = tmp / "labels.txt"
    labels.write_text("\n".join(LABELS) + "\n")
    return train, held, labels
