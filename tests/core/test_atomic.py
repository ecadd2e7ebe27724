"""Whole files or nothing (issue 26.3): dplora.atomic on a simulated full disk (ENOSPC from the file's write or
fsync, os.write for appends). The target keeps its old bytes or stays absent, no temp file remains, and the one-line
error names the file and the bytes needed against those free."""

from __future__ import annotations

import errno
import json
import os
import re

import pytest

from dplora import atomic


def _full(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_write_json_on_a_full_disk_keeps_the_old_file_and_names_it(tmp_path, monkeypatch):
    target = tmp_path / "FAILED.json"
    atomic.write_json(target, {"old": 1})
    monkeypatch.setattr(atomic.os, "fsync", _full)
    with pytest.raises(atomic.DiskFullError) as info:
        atomic.write_json(target, {"new": "x" * 1000})
    message = str(info.value)
    assert str(target) in message and "\n" not in message
    # no byte count: the size of a run's private files grows with the steps it took and carries their numbers
    assert "free space in" in message and not re.search(r"\d+ bytes", message)
    assert info.value.exit_code == 4
    assert json.loads(target.read_text()) == {"old": 1}  # the old bytes, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FAILED.json"]  # no temp left


def test_a_first_write_on_a_full_disk_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic.os, "fsync", _full)
    with pytest.raises(atomic.DiskFullError, match="contract.yaml"):
        atomic.write_text(tmp_path / "contract.yaml", "a: 1\n")
    assert list(tmp_path.iterdir()) == []  # no 0-byte target, no temp


def test_quota_exceeded_is_named_as_such(tmp_path, monkeypatch):
    def quota(*_a):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(atomic.os, "fsync", quota)
    with pytest.raises(atomic.DiskFullError, match="^quota exceeded writing"):
        atomic.write_bytes(tmp_path / "x.bin", b"abc")


def test_other_errors_stay_oserrors_and_remove_the_temp(tmp_path, monkeypatch):
    def denied(*_a):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(atomic.os, "fsync", denied)
    with pytest.raises(OSError) as info:
        atomic.write_text(tmp_path / "a.txt", "x")
    assert not isinstance(info.value, atomic.DiskFullError) and list(tmp_path.iterdir()) == []


def test_append_line_cut_by_a_full_disk_leaves_no_partial_line(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    handle = path.open("a")
    atomic.append_line(handle, json.dumps({"step": 1}))
    real_write = os.write

    def half_then_full(fd, data):  # the kernel takes part of the line, then the disk is full
        if len(data) > 4:
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(atomic.os, "write", half_then_full)
    with pytest.raises(atomic.DiskFullError, match="metrics.jsonl"):
        atomic.append_line(handle, json.dumps({"step": 2, "loss": 1.5}))
    handle.close()
    assert path.read_text() == '{"step": 1}\n'  # cut back to the last whole line
    assert atomic.complete_lines('{"step": 1}\n{"step": 2, "lo') == ['{"step": 1}']  # a cut line is never read
