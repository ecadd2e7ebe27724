"""A failed run charges what it spent (issue 7): at 0 steps ε = 0 in FAILED.json and in the ledger, the real
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
    assert failed["steps_done"] == 0 and failed["epsilon_charged_upper_bound"] == 0.0
    assert "injected" in failed["reason"]
    # A resume checkpoint (written before step 1) keeps the charge pending at the reserved ε until the run is
    # resumed or closed; closing it charges the ε of the 0 accounted steps: 0, finite.
    (charge,) = Ledger(db).charges("tickets")
    assert charge.status == "pending"
    closed = CliRunner().invoke(app, ["ledger", "settle", charge.run_id, "--abandon", "--ledger", str(db)])
    assert closed.exit_code == 0, closed.output
    (charge,) = Ledger(db).charges("tickets")
    assert charge.status == "failed" and float(charge.epsilon) == 0.0 and math.isfinite(float(charge.epsilon))
    assert not out.exists()


def test_a_failure_inside_the_first_optimizer_step_reports_zero_steps_done(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """A fault inside step 1's optimizer update (after its noise and accountant step, as a huge lr once did):
    FAILED.json says 0 steps done, as the failure line does ("at step 0"), and still charges that step's noise."""
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
    assert "step 0" in result.output
    failed = json.loads((out.with_name("run.partial") / "FAILED.json").read_text())
    assert failed["steps_done"] == 0, failed
    assert failed["epsilon_charged_upper_bound"] > 0  # the step's noisy sum was drawn: charged all the same
