"""A failed run charges what it spent: at 0 steps ε = 0 in the private FAILED.json, the real
cause stays in the message, and no non-finite ε is ever written. Tiny random Llama; no downloads."""

from __future__ import annotations

import json
import math

from conftest import contract_dict, write_contract
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.errors import TrainingFailedError
from dplora.ledger.store import Ledger
from dplora.plan.training import TrainingPlan


def test_failure_before_step_one_charges_zero(tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key):
    """The budget stop fails before step 1: exit 4, FAILED.json at ε = 0 for 0 steps, the charge closes at 0."""

    def refuse(self, step):
        if step >= 1:
            raise TrainingFailedError("injected: the accountant refused step 1")
        return 0.0

    monkeypatch.setattr(TrainingPlan, "epsilon_at", refuse)
    db = tmp_path / "ledger.sqlite3"
    Ledger(db).set_cap("tickets", epsilon_max="100", delta_max="1e-3", protected_unit="row", adjacency="add_remove")
    out = tmp_path / "run"
    cfg = write_contract(
        tmp_path / "c.yaml", contract_dict(tiny_model_dir, tickets_csv, out, privacy={"population": "tickets"})
    )
    result = CliRunner().invoke(
        app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress", "--ledger", str(db)]
    )
    assert result.exit_code == 4, result.output
    assert "injected: the accountant refused step 1" in result.output  # the real cause, not "ε=inf"
    assert "small population" in result.output  # N = 120 rows: the warning train prints before it starts
    failed = json.loads((out.with_name("run.partial") / "FAILED.json").read_text())
    assert "steps_done" not in failed and failed["stage"] == "training" and "injected" in failed["reason"]
    private = json.loads((out.with_name("run.partial") / "private" / "FAILED.json").read_text())
    assert private["steps_done"] == 0 and private["epsilon_spent_upper_bound"] == 0.0
    # A resume checkpoint (written before step 1) keeps the charge pending at the reserved ε until the run is
    # resumed or closed; closing it charges the reserved ε (the step a failure stopped at is never charged).
    (charge,) = Ledger(db).charges("tickets")
    assert charge.status == "pending"
    reserved = float(charge.epsilon)
    assert failed["epsilon_reserved"] == reserved
    closed = CliRunner().invoke(app, ["ledger", "settle", charge.run_id, "--abandon", "--ledger", str(db)])
    assert closed.exit_code == 0, closed.output
    (charge,) = Ledger(db).charges("tickets")
    assert charge.status == "failed" and float(charge.epsilon) == reserved and math.isfinite(reserved)
    assert not out.exists()


def test_a_failure_inside_the_first_optimizer_step_reports_zero_steps_done(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """A fault inside step 1's optimizer update (after its noise and accountant step, as a huge lr once did):
    the private FAILED.json says 0 steps done and still charges that step's noise; the public line names no step."""
    import torch

    def broken(self, *args, **kwargs):
        raise RuntimeError("injected fault in the optimizer update")

    monkeypatch.setattr(torch.optim.AdamW, "step", broken)
    out = tmp_path / "run"
    cfg = write_contract(tmp_path / "c.yaml", contract_dict(tiny_model_dir, tickets_csv, out))
    db = tmp_path / "ledger.sqlite3"
    result = CliRunner().invoke(
        app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress", "--ledger", str(db)]
    )
    assert result.exit_code == 4, result.output
    assert "training failed: RuntimeError" in result.output and "step 0" not in result.output
    failed = json.loads((out.with_name("run.partial") / "private" / "FAILED.json").read_text())
    assert failed["steps_done"] == 0, failed
    assert failed["epsilon_spent_upper_bound"] > 0  # the step's noisy sum was drawn: charged all the same
