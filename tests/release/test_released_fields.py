"""Issue 23 items 1–2: nothing released depends on the private N, and only covered files are in the release.

Neighbouring datasets under add/remove (one row removed) must give records that are identical apart from ids,
timestamps and digests; the release folder must hold no realised batch size, loss or wall time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import release_statement, train_tiny


def test_undeclared_n_under_add_remove_refuses_to_release(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """Add/remove without privacy.num_units: exit 2, one line saying what to do, nothing written."""
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, privacy={"num_units": None})
    assert result.exit_code == 2, result.output
    assert "privacy.num_units: declare N as a public number" in result.output
    # the counted N is private: the refusal never prints it (dplora budget --show-private does, locally)
    assert "120" not in result.output and "Traceback" not in result.output
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()
    assert not out.with_name(out.name + ".private").exists()


def test_private_folder_is_replaced_only_when_dplora_wrote_it(tmp_path, monkeypatch):
    """``<output_dir>.private``: a foreign one is refused always; a previous run's one only with --overwrite."""
    from dplora.errors import BadInputError
    from dplora.run import outputs

    monkeypatch.chdir(tmp_path)
    private = tmp_path / "run.private"
    private.mkdir()
    (private / "notes.txt").write_text("mine")
    with pytest.raises(BadInputError, match="was not written by dplora"):
        outputs.check_output_dir("run", overwrite=True, protected=())
    (private / "notes.txt").unlink()
    (private / outputs.PRIVATE_NOTICE).write_text(outputs.PRIVATE_NOTICE_TEXT)
    with pytest.raises(BadInputError, match="pass --overwrite"):
        outputs.check_output_dir("run", overwrite=False, protected=())
    assert outputs.check_output_dir("run", overwrite=True, protected=()) == Path("run")


def test_the_records_only_time_is_taken_before_the_data_is_read(
    tmp_path, tiny_model_dir, tickets_csv, signing_key, monkeypatch
):
    """Issue 49 ("the record's time"): ``started_at`` is read from the clock BEFORE the private data is read, so it
    cannot time anything that depends on the data; the clock is stamped with whether the data was read yet."""
    import dplora.recipe.train as train_mod

    read, stamps = [], []
    real_load = train_mod.data_mod.load_split

    def load_split(*args, **kwargs):
        read.append(True)
        return real_load(*args, **kwargs)

    def clock() -> str:
        stamps.append(bool(read))
        return f"2001-01-01T00:00:{len(stamps):02d}+00:00"

    monkeypatch.setattr(train_mod.data_mod, "load_split", load_split)
    monkeypatch.setattr(train_mod, "utc_now", clock)
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, name="clock")
    assert result.exit_code == 0, result.output
    assert read and stamps == [False]  # one reading of the clock in the recipe, before the data
    assert release_statement(out)["predicate"]["started_at"] == "2001-01-01T00:00:01+00:00"


def test_the_record_names_the_optimizer_and_the_model_by_name_and_sha256(
    tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    """The optimization section and the card name the optimizer with its public parameters (DP-AdamBC's Φ from
    the plan's σ, C and E); the record names the model by folder name and sha256, never the machine's path."""
    import hashlib

    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, training={"optimizer": "dp_adambc"})
    assert result.exit_code == 0, result.output
    record = release_statement(out)["predicate"]
    opt = record["optimization"]["optimizer"]
    mech = record["mechanism"]
    phi = (mech["noise_multiplier"] * mech["max_grad_norm"] / mech["normalizer"]["expected_units_per_step"]) ** 2
    assert opt["name"] == "dp_adambc" and opt["noise_variance_phi"] == pytest.approx(phi, rel=1e-12)
    assert opt["betas"] == [0.9, 0.999] and opt["gamma"] == 1e-8
    model = record["model"]
    assert "path" not in model and model["file"] == tiny_model_dir.name
    files = record["base_model"]["files"]
    canonical = json.dumps(files, sort_keys=True, separators=(",", ":")).encode()
    assert model["sha256"] == hashlib.sha256(canonical).hexdigest()
    text = json.dumps(record)
    assert str(tiny_model_dir) not in text and str(tmp_path) not in text  # no path of the training machine
    card = (out / "adapter" / "README.md").read_text()
    assert "- Optimizer: DP-AdamBC at lr " in card and f"Φ = {phi:.6g}" in card


def test_a_run_leaves_the_parent_folders_mtime_as_it_found_it(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """The folder above the output keeps its mtime from before the run (the lock, .partial/, the rename into place
    and .private/ all change it; the run puts it back after its last change), and a parent the run created carries
    the record's start time: neither shows when the run ended."""
    import datetime as dt
    import os

    from conftest import contract_dict, write_contract
    from typer.testing import CliRunner

    from dplora.cli.app import app

    def train(out: Path, cfg: Path):
        write_contract(cfg, contract_dict(tiny_model_dir, tickets_csv, out))
        return CliRunner().invoke(app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"])

    old = 1_000_000_000_000_000_000  # 2001-09-09, long before the run
    parent, configs = tmp_path / "runs", tmp_path / "configs"
    parent.mkdir()
    configs.mkdir()
    os.utime(parent, ns=(old, old))
    result = train(parent / "run", configs / "a.yaml")
    assert result.exit_code == 0, result.output
    assert (parent / "run" / "release.dsse.json").is_file() and (parent / "run.private").is_dir()
    assert parent.stat().st_mtime_ns == old
    # a parent the run created carries the record's start time; the folder above it keeps its own
    os.utime(parent, ns=(old, old))
    result = train(parent / "new" / "run", configs / "b.yaml")
    assert result.exit_code == 0, result.output
    started = dt.datetime.fromisoformat(release_statement(parent / "new" / "run")["predicate"]["started_at"])
    assert (parent / "new").stat().st_mtime == pytest.approx(started.timestamp(), abs=1e-3)
    assert parent.stat().st_mtime_ns == old
