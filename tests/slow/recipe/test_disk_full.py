"""No 0-byte or half-written files in ``.partial`` (issue 26.3), and the loser of a ledger race leaves nothing.

A full disk is simulated by file objects whose ``write`` raises ENOSPC for one target name (both ``Path.open``
and ``os.fdopen`` are wrapped, so the test is the same for any writer). Tiny random Llama; no downloads.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib

from conftest import train_tiny

from dplora.errors import TrainingFailedError
from dplora.ledger.store import Ledger
from dplora.plan.training import TrainingPlan


class _FullDisk:
    """A file object whose writes fail with ENOSPC (everything else is the real file's)."""

    def __init__(self, real):
        self._real = real

    def write(self, _data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._real.close()

    def __getattr__(self, name):
        return getattr(self._real, name)


def _disk_full_for(monkeypatch, name: str) -> None:
    """Every write to a file whose name contains ``name`` (or to its temp file) fails with ENOSPC."""
    real_open, real_fdopen = pathlib.Path.open, os.fdopen

    def path_open(self, mode="r", *a, **k):
        f = real_open(self, mode, *a, **k)
        return _FullDisk(f) if name in self.name and any(m in mode for m in "wax") else f

    def fdopen(fd, mode="r", *a, **k):
        target = os.readlink(f"/proc/self/fd/{fd}")
        f = real_fdopen(fd, mode, *a, **k)
        return _FullDisk(f) if name in os.path.basename(target) and any(m in mode for m in "wax") else f

    monkeypatch.setattr(pathlib.Path, "open", path_open)
    monkeypatch.setattr(os, "fdopen", fdopen)


def test_full_disk_at_contract_yaml_names_it_and_leaves_no_empty_file(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """After training, contract.yaml cannot be written: exit 4 (an environment fault after work began), the
    message names the file and the free space; no 0-byte contract.yaml, no temp; FAILED.json whole."""
    _disk_full_for(monkeypatch, "contract.yaml")
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key)
    assert result.exit_code == 4, result.output
    staging = out.with_name("run.partial")
    assert "contract.yaml" in result.output and "free space in" in result.output, result.output
    assert "--resume once there is free space" in result.output  # the resume hint stays
    assert not (staging / "contract.yaml").exists()  # never 0 bytes: absent
    assert not [p for p in staging.rglob("*") if p.name.endswith(".tmp")]
    failed = json.loads((staging / "FAILED.json").read_text())  # written whole (it fits)
    assert "contract.yaml" in failed["reason"] and not out.exists()


def test_full_disk_at_failed_json_leaves_no_empty_file(tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key):
    """A run that fails when FAILED.json cannot be written either: exit 4 with the real cause; FAILED.json is
    whole or absent, never 0 bytes."""

    def refuse(self, step):
        if step >= 1:
            raise TrainingFailedError("injected: the accountant refused step 1")
        return 0.0

    monkeypatch.setattr(TrainingPlan, "epsilon_at", refuse)
    _disk_full_for(monkeypatch, "FAILED.json")
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key)
    assert result.exit_code == 4 and "injected" in result.output, result.output
    staging = out.with_name("run.partial")
    assert not (staging / "FAILED.json").exists()
    assert not [p for p in staging.rglob("*") if p.name.endswith(".tmp")]


def test_the_loser_of_a_ledger_race_leaves_nothing(tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key):
    """Two trains on one population: the other run reserves the last of the cap between this run's check and its
    reservation. This run exits 2 and leaves no output, no .partial (no .dplora-partial marker), no lock."""
    db = tmp_path / "ledger.sqlite3"
    Ledger(db).set_cap("tickets", epsilon_max="100", delta_max="1e-3", protected_unit="row", adjacency="add_remove")
    real_reserve = Ledger.reserve

    def winner_first(self, **kw):  # the other process's transaction commits first and takes the whole cap
        real_reserve(self, **{**kw, "run_id": "winner", "epsilon": "99.9999", "events": None})
        return real_reserve(self, **kw)

    monkeypatch.setattr(Ledger, "reserve", winner_first)
    result, out = train_tiny(
        tmp_path, tiny_model_dir, tickets_csv, signing_key, "--ledger", str(db), privacy={"population": "tickets"}
    )
    assert result.exit_code == 2, result.output
    assert "over" in result.output or "exceed" in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["ledger.sqlite3", "run.yaml"] + [p.name for p in tmp_path.iterdir() if p.name.startswith("ledger.sqlite3-")]
    )
    assert [c.run_id for c in Ledger(db).charges("tickets")] == ["winner"]  # the loser charged nothing


def test_a_full_disk_at_the_partial_marker_leaves_no_unmarked_partial(tmp_path, monkeypatch):
    """The `.dplora-partial` marker cannot be written: DiskFullError names it, and no unmarked `.partial` (which
    the next run would refuse to replace) stays behind."""
    import pytest

    from dplora import atomic
    from dplora.run import outputs

    _disk_full_for(monkeypatch, outputs.PARTIAL_MARKER)
    with pytest.raises(atomic.DiskFullError, match=outputs.PARTIAL_MARKER):
        outputs.fresh_staging(tmp_path / "run")
    assert list(tmp_path.iterdir()) == []


def test_full_disk_while_saving_the_adapters_leaves_no_half_written_adapter(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """peft's save_pretrained writes the safetensors file with its own open(): half of it lands, then ENOSPC.
    The adapters are written into a temp folder and renamed, so `.partial/adapter` never holds part of a file,
    and the one-line error names the adapter folder and the bytes needed (exit 4, resumable)."""
    import peft.peft_model
    from safetensors.torch import save as st_save

    def half_then_full(tensors, filename, metadata=None):
        data = st_save(tensors, metadata=metadata)
        with open(filename, "wb") as fh:
            fh.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    monkeypatch.setattr(peft.peft_model, "safe_save_file", half_then_full)
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key)
    assert result.exit_code == 4, result.output
    staging = out.with_name(out.name + ".partial")
    assert f"disk full writing {staging.resolve() / 'adapter'}" in result.output and "free space in" in result.output
    assert not (staging / "adapter").exists()
    assert not [p for p in staging.rglob("*") if p.name.endswith(".tmp")]
    assert not (out / "release.dsse.json").exists()
