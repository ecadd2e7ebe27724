"""The slow tier of tests/audit/test_audit.py, whose docstring describes the module."""

from __future__ import annotations

import json
import math

import pytest
from conftest import contract_dict, write_contract
from typer.testing import CliRunner

from dplora.audit import bound
from dplora.cli.app import app

runner = CliRunner()


pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


def test_control_audit_refused_on_private_data(tmp_path, tiny_model_dir, tickets_csv):
    cfg = write_contract(
        tmp_path / "c.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp_path / "o", privacy={"enabled": False})
    )
    result = runner.invoke(app, ["audit", str(cfg), "--no-progress"])
    assert result.exit_code == 2
    assert "public or surrogate" in result.output
    assert not (tmp_path / "o-audit").exists()


def test_audit_trains_through_the_engine_and_reports(tmp_path, tiny_model_dir, tickets_csv):
    cfg = write_contract(tmp_path / "a.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp_path / "o"))
    result = runner.invoke(
        app, ["audit", str(cfg), "--canaries", "12", "--candidates", "20", "--no-progress", "--plot", "--threads", "1"]
    )
    assert result.exit_code in (0, 5), result.output
    folder = tmp_path / "o-audit"
    report = json.loads((folder / "audit.json").read_text())
    assert (folder / "audit.md").read_text().startswith("# dplora audit")
    assert (folder / "audit_scores.png").read_bytes()[:4] == b"\x89PNG"
    assert (folder / "run" / "release.dsse.json").is_file()  # an ordinary dplora train run
    assert not (folder / "audit-run.key").exists()
    per = report["per_canary"]
    assert len(per) == report["canaries"] == 12 and sum(c["inserted"] for c in per) == report["inserted"]
    for c in per:
        assert c["score"] == pytest.approx(c["base_loss"] - c["adapter_loss"])
        assert 0.0 <= c["exposure"] <= math.log2(21) + 1e-9
    r, v = bound.count_correct([c["score"] for c in per], [c["inserted"] for c in per], k_in=3, k_out=3)
    assert (report["guesses"], report["correct"]) == (r, v) == (6, v)
    assert report["epsilon_lower_bound"] == bound.epsilon_lower_bound(m=12, r=r, v=v, delta=1e-5)
    assert report["claimed_epsilon"] <= 8.0 and report["violation"] == (result.exit_code == 5)
    # each inserted canary is one more protected unit; N stays the declared public 120 (issue 23): more units than
    # declared is a local warning in the audit run's private log only (issue 40: never on the public output)
    assert "N=120 units" in result.output
    assert "more protected units" not in result.output and "minutes" not in report  # the audit's time is private
    if report["inserted"]:
        private = "".join(p.read_text() for p in tmp_path.glob("**/*.private/train.log"))
        assert "more protected units than privacy.num_units=120" in private


def test_planted_bug_no_noise_is_flagged_with_exit_5(tmp_path, monkeypatch):
    """The accountant claims ε = 1 but the engine adds (almost) no noise: the audit must exit 5.

    The planted bug scales σ by 1e-6 inside the engine's noise step (exactly zero noise is already caught by the
    engine's own check that every LoRA tensor moved after step 1, exit 4). Tiny random Llama (hidden 64, lm_head
    ×5), 8 demo tickets and 32 canaries of 8 records each at ticket level.
    """
    from tiny import byte_tokenizer, tiny_llama

    import dplora.mechanism.optimizer
    from dplora.data.demo import write_tickets

    model = tiny_llama(hidden=64)
    model.lm_head.weight.data *= 5.0
    model.save_pretrained(tmp_path / "model")
    byte_tokenizer().save_pretrained(tmp_path / "model")
    write_tickets(tmp_path / "t.csv", num_tickets=8, seed=1)
    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    raw = contract_dict(
        tmp_path / "model",
        tmp_path / "t.csv",
        tmp_path / "o",
        # N declared public: 8 tickets + about half of the 32 canaries inserted
        privacy={"protected_unit": "ticket", "unit_key": "ticket_id", "target_epsilon": 1.0, "num_units": 24},
        lora={"r": 8, "alpha": 16, "target_modules": modules},
        training={"expected_batch_size": 16, "physical_batch_size": 32, "steps": 120, "lr": 0.01, "max_seq_len": 128},
    )
    cfg = write_contract(tmp_path / "bug.yaml", raw)
    honest = dplora.mechanism.optimizer.privatize
    monkeypatch.setattr(
        dplora.mechanism.optimizer,
        "privatize",
        lambda s, **kw: honest(s, **(kw | {"noise_multiplier": kw["noise_multiplier"] * 1e-6})),
    )
    args = ["audit", str(cfg), "--canaries", "32", "--copies", "8", "--candidates", "100", "--no-progress"]
    result = runner.invoke(app, [*args, "--data-source", "surrogate"])
    report = json.loads((tmp_path / "o-audit" / "audit.json").read_text())
    assert result.exit_code == 5, result.output
    assert report["violation"] and report["epsilon_lower_bound"] > report["claimed_epsilon"] > 0.99
