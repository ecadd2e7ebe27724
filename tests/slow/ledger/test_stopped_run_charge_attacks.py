"""Attack on the charge of a stopped run: a run that stops at step k for any reason is charged k steps, whether it
is then run again with ``--overwrite`` or ``--resume`` (dplora.ledger.charge.RunCharge)."""

from __future__ import annotations

import dataclasses

import pytest
from support.row_contract import contract_raw


@pytest.mark.parametrize("then", ["overwrite", "resume"])
def test_a_run_stopped_at_step_k_stays_charged_k_steps(tmp_path, tiny_model_dir, signing_key, monkeypatch, then):
    """Guarantee (docs/sharp_edges.md overflow row): 'a run that stops at step k for any reason is charged
    k steps'. Attack: the noisy update of step 3 is NaN (a DP output: the only stop rule), so the run stops with
    exit 4 and publishes 'non-finite parameter after step 3' (a function of 3 noisy steps). Its only resume
    checkpoint is the one written before step 1 (training.checkpoint_every unset: about every 10 minutes). Running
    again with --overwrite discards that checkpoint and settles the pending charge 'at the ε of the checkpoint's
    steps' (RunCharge.settle_discarded): ε(0) = 0, not ε(3). (With --resume instead, steps 1..3 are run again
    under the one reservation of T steps: T + 3 noisy steps of the same data under a charge of T.)
    Found: the failed run's ledger charge is settled at ε = 0 (overwrite); the resumed run's charge holds T = 8 steps
    (resume)."""
    import yaml

    from dplora.contract.loader import parse_contract
    from dplora.errors import TrainingFailedError
    from dplora.ledger.store import Ledger, default_ledger_path
    from dplora.mechanism import optimizer as dpopt
    from dplora.recipe.config import RunOptions
    from dplora.recipe.train import run_training

    monkeypatch.setenv("DPLORA_LEDGER", str(tmp_path / "ledger.sqlite3"))  # this test's own ledger
    training = {"expected_batch_size": 4, "physical_batch_size": 4, "steps": 8, "max_seq_len": 24}
    raw = contract_raw(tmp_path, tiny_model_dir, rows=8, training=training)
    raw["lora"].update(r=2, alpha=4)
    contract = parse_contract(yaml.safe_load(yaml.safe_dump(raw)))
    real, calls = dpopt.privatize, []

    def nan_at_step_3(clipped_sum, **kw):
        calls.append(1)
        out = real(clipped_sum, **kw)
        return out * float("nan") if len(calls) == 3 else out

    monkeypatch.setattr(dpopt, "privatize", nan_at_step_3)
    opts = RunOptions(signing_key=signing_key[0], data_key=None, progress=False, threads=1)
    with pytest.raises(TrainingFailedError, match="after step 3"):
        run_training(contract, opts, log=print)
    with Ledger(default_ledger_path(), create=False) as ledger:
        (failed,) = [c for c in ledger.unassigned() if c.status == "pending"]  # this test's run (a shared ledger)
    monkeypatch.setattr(dpopt, "privatize", real)
    if then == "resume":  # fixed: refused (redoing steps 1..3 would spend more than the charge of T steps)
        from dplora.errors import BadInputError

        with pytest.raises(BadInputError, match=r"took 3 steps but its last checkpoint holds [0-2]\b"):
            run_training(contract, dataclasses.replace(opts, resume=True), log=print)
        with Ledger(default_ledger_path(), create=False) as ledger:
            assert ledger.charge(failed.run_id).status == "pending"  # still held at its reservation of T steps
        return
    result = run_training(contract, dataclasses.replace(opts, **{then: True}), log=print)
    with Ledger(default_ledger_path(), create=False) as ledger:
        settled = ledger.charge(failed.run_id)
    stopped_at = result.plan.epsilon_at(3)
    assert settled.status == "failed"
    assert float(settled.epsilon) >= stopped_at - 1e-9, f"charged ε={settled.epsilon}, 3 steps are ε={stopped_at}"
