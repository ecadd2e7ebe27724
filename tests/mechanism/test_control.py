"""The non-private control (privacy.enabled: false): the step by hand, its own signed record, verify exit 6, the
ledger's ε = ∞ charge and the --non-private refusal, and generate's refusal."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
import torch
from conftest import contract_dict, reserve_charge, write_contract
from support.control import runner

from dplora.cli.app import app
from dplora.ledger.store import Ledger
from dplora.mechanism.control import NonPrivateStep, StepCounter

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


def test_non_private_step_is_the_plain_summed_gradient_over_the_public_normaliser():
    """Two physical batches, SGD: Δw = −lr · Σ_records ∇ℓ / B (no clip even for a huge gradient, no noise)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(3))
    x = torch.randn(5, 3) * 100.0  # per-record gradients far above any clip norm
    counter = StepCounter()
    step = NonPrivateStep(torch.optim.SGD([w], lr=0.1), expected_batch_size=4, counter=counter)
    start = w.detach().clone()
    step.begin_logical_step(5)
    for rows in (slice(0, 3), slice(3, 5)):  # each record's loss: (w·x)², one backward per physical batch
        step.prepare_batch(rows.stop - rows.start)
        ((x[rows] @ w) ** 2).sum().backward()
        step.accumulate(torch.arange(5)[rows], continues=False, row_weight=torch.ones(rows.stop - rows.start))
    step.step()
    by_hand = sum(2 * float(xi @ start) * xi for xi in x)  # Σ_r ∇(w·x_r)² = Σ_r 2 (w·x_r) x_r
    assert torch.allclose(w.detach(), start - 0.1 * by_hand / 4, rtol=1e-5)
    assert counter.steps == 1
    step.zero_grad()
    before = w.detach().clone()
    step.begin_logical_step(0)  # an empty Poisson batch: a zero gradient, still one step
    step.step()
    assert torch.equal(w.detach(), before) and counter.steps == 2


def test_a_failed_control_stays_charged_infinite(tmp_path):
    """Reserve ε = ∞, fail: the charge stays ∞ (the data was used without DP); a DP settle cannot reach ∞."""
    from dplora.errors import PlanRefusedError

    with Ledger(tmp_path / "l.sqlite3") as ledger:
        ledger.reserve_non_private(population="p", run_id="r1", adjacency="add_remove")
        charge = ledger.settle("r1", epsilon_spent=float("inf"), status="failed")
        assert charge.epsilon == Decimal("Infinity") and charge.status == "failed"
        ledger.set_cap("q", epsilon_max="5", delta_max="1e-5", protected_unit="row", adjacency="add_remove")
        reserve_charge(ledger, "q", "r2", "1")
        with pytest.raises(PlanRefusedError):
            ledger.settle("r2", epsilon_spent=float("inf"))


def test_budget_says_the_control_is_not_private(tmp_path, tiny_model_dir, tickets_csv):
    cfg = write_contract(
        tmp_path / "c.yaml",
        contract_dict(tiny_model_dir, tickets_csv, tmp_path / "o", privacy={"enabled": False, "population": "p"}),
    )
    result = runner.invoke(app, ["budget", str(cfg), "--json", "--ledger", str(tmp_path / "none.sqlite3")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert any("NOT DIFFERENTIALLY PRIVATE" in w for w in report["warnings"]) and "ledger" not in report
