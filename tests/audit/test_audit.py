"""dplora audit: canaries as protected units, exposure and AUC by hand, the CLI on a tiny model, refusals."""

from __future__ import annotations

import json
import math

import pytest
from conftest import contract_dict, write_contract
from typer.testing import CliRunner

from dplora.audit import bound, canaries, scores
from dplora.cli.app import app
from dplora.contract.loader import load_contract

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


def test_exposure_and_auc_by_hand():
    # canary loss 1.0 among candidates [0.5, 2, 3]: rank 2 of 4 → log2(4) − log2(2) = 1 bit.
    assert scores.exposure(1.0, [0.5, 2.0, 3.0]) == pytest.approx(1.0)
    assert scores.exposure(0.1, [0.5, 2.0, 3.0]) == pytest.approx(2.0)  # rank 1: the maximum, log2(4)
    assert scores.exposure(5.0, [0.5, 2.0, 3.0]) == pytest.approx(0.0)
    # members [3, 1], non-members [2, 1]: pairs (3>2, 3>1, 1<2, 1=1) → (1 + 1 + 0 + 0.5) / 4.
    assert scores.auc([3.0, 1.0], [2.0, 1.0]) == pytest.approx(0.625)
    with pytest.raises(ValueError):
        scores.auc([], [1.0])


def test_canary_rows_one_unit_each(tmp_path, tiny_model_dir, tickets_csv):
    cfg = write_contract(
        tmp_path / "t.yaml",
        contract_dict(
            tiny_model_dir, tickets_csv, tmp_path / "o", privacy={"protected_unit": "ticket", "unit_key": "ticket_id"}
        ),
    )
    contract = load_contract(cfg)
    rows = canaries.canary_rows(
        contract.data, contract.privacy.unit_key, "dplora-canary-00001", "AAAA-BBBB-CCCC-DDDD", copies=4
    )
    assert len(rows) == 4 and {r["ticket_id"] for r in rows} == {"dplora-canary-00001"}
    assert all("AAAA-BBBB-CCCC-DDDD" in r["reply"] and r["message"] == canaries.PROMPT for r in rows)
    row_level = load_contract(write_contract(tmp_path / "r.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp_path)))
    with pytest.raises(ValueError, match="copies=2"):
        canaries.canary_rows(row_level.data, row_level.privacy.unit_key, "u", "s", copies=2)
    drawn = canaries.make_canaries(400)
    assert len({c.secret for c in drawn}) == 400 and len({c.unit_id for c in drawn}) == 400
    assert 140 < sum(c.inserted for c in drawn) < 260  # Binomial(400, 1/2): mean 200, sd 10


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


@pytest.mark.slow
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
