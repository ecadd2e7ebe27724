"""``dplora budget`` stays light (issue 29): no torch/transformers/peft/opacus/datasets on its path, and the csv it
reads without ``datasets`` gives the same cells as ``datasets`` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from dplora.data.readers import read_csv_text, read_table

ROOT = Path(__file__).resolve().parents[2]


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
