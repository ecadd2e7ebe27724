"""``dplora budget`` stays light (issue 29): no torch/transformers/peft/opacus/datasets on its path, and the csv it
reads without ``datasets`` gives the same cells as ``datasets`` does."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import budget_in_subprocess

from dplora.data.readers import read_csv_text, read_table

ROOT = Path(__file__).resolve().parents[2]

CONTRACT = """\
privacy: {protected_unit: user, unit_key: user_id, adjacency: add_remove, target_epsilon: 8, delta: 1.0e-5,
          max_grad_norm: 1.0, num_units: 100, max_records_per_unit: 2}
model: {path: /nonexistent}
data: {path: data.csv, prompt_column: message, response_column: reply, eval_fraction: 0.1}
training: {expected_batch_size: 16, steps: 20}
"""


@pytest.mark.parametrize("held_out", ["eval_fraction: 0.1", "eval_path: held.csv"])
def test_budget_with_the_default_accountant_imports_no_torch_stack_nor_datasets(tmp_path, held_out):
    (tmp_path / "contract.yaml").write_text(CONTRACT.replace("eval_fraction: 0.1", held_out))  # accountant: default
    rows = ["user_id,message,reply"] + [f"u{i % 120},question {i},answer {i}" for i in range(300)]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "held.csv").write_text("\n".join(rows[:20]) + "\n")
    probe, report, _ = budget_in_subprocess(tmp_path)
    assert probe == {"code": 0, "heavy": []}
    assert report["accountant"] == "prv" and report["epsilon"] <= 8
    stats = report["not_covered_by_dp"]["unit_stats"]
    assert stats["max_records_per_unit_after_cap"] == 2 and stats["dropped_by_cap"] > 0  # the data was read


def test_budget_recommend_imports_no_torch_stack(tmp_path):
    (tmp_path / "contract.yaml").write_text(CONTRACT.replace("num_units: 100", "num_units: 1000"))
    probe, report, _ = budget_in_subprocess(tmp_path, "--recommend", "--max-steps", "60")
    assert probe == {"code": 0, "heavy": []}
    assert report["recommendation"]["choice"]["steps"] <= 60 == report["recommendation"]["inputs"]["max_steps"]


TRICKY = [
    # (name, file bytes): each is a valid csv train reads
    ("plain", b"message,reply\nhi,there\nNaN,null\nNone,NA\n"),
    ("bom-crlf", b"\xef\xbb\xbfmessage,reply\r\nh\xc3\xa9,\xe2\x82\xac 5\r\n"),
    ("quoted", b'message,reply\n"a, b","line one\nline two"\n"say ""hi""", x \n'),
    ("blank-lines", b"message,reply\n\nq1,a1\n\n\nq2,a2\n\n"),
    ("empty-header-cell", b"message,,reply\nq,x,a\nq2,,a2\n"),
    ("one-column", b'text\nfirst\n   \n"  padded  "\nlast'),
    ("no-final-newline", b"message,reply\nq,a"),
]


@pytest.mark.parametrize("name,content", TRICKY, ids=[t[0] for t in TRICKY])
def test_read_csv_text_equals_datasets_reading(tmp_path, name, content):
    path = tmp_path / f"{name}.csv"
    path.write_bytes(content)
    reference = read_table(path, "csv")
    light = read_csv_text(path)
    assert light.column_names == reference.column_names
    assert light.num_rows == reference.num_rows
    for column in reference.column_names:
        assert light[column] == list(reference[column])
    assert light.select([light.num_rows - 1, 0])[light.column_names[0]] == [
        reference[light.column_names[0]][-1],
        reference[light.column_names[0]][0],
    ]
