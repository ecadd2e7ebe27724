"""Resume checkpoints, faults that stop cleanly, and a ledger that recovers (tiny random Llama, T=8 steps).

Kill points are fixed by the ``DPLORA_TEST_FAULT`` hook (``dplora.run.checkpoint.fault_point``): a subprocess
SIGKILLs itself there; in-process tests replace the hook with a signal, a full disk or an exception.
"""

from __future__ import annotations

from conftest import reserve_charge
from support.resume import partial_dir, runner, setup, train

from dplora.cli.app import app
from dplora.ledger.store import Ledger
from dplora.run import checkpoint


def test_settle_without_a_readable_checkpoint_charges_the_planned_epsilon(tmp_path):
    """A checkpoint that cannot be read (here: truncated) cannot be resumed: settle charges the reservation."""
    db = tmp_path / "l.sqlite3"
    ledger = Ledger(db)
    ledger.set_cap("tickets", epsilon_max="10", delta_max="1e-3", protected_unit="row", adjacency="add_remove")
    reserve_charge(ledger, "tickets", "r1", "3.5", "1e-5")
    staging = tmp_path / "run.partial"
    staging.mkdir()
    (staging / checkpoint.CHECKPOINT_FILENAME).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    ledger.set_checkpoint_path("r1", str(staging))
    result = runner.invoke(app, ["ledger", "settle", "r1", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "planned ε" in result.output and "cannot be read" in result.output
    charge = Ledger(db).charge("r1")
    assert charge.status == "failed" and str(charge.epsilon) == "3.5"


def test_rerun_keeps_a_failed_runs_folder_without_overwrite(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """A .partial folder with FAILED.json (no checkpoint) is not deleted by a rerun without --overwrite."""
    cfg, out, db = setup(tmp_path, tiny_model_dir, tickets_csv, "failed")
    partial_dir(out).mkdir()
    (partial_dir(out) / "FAILED.json").write_text('{"reason": "earlier"}')
    result = train(cfg, db, signing_key)
    assert result.exit_code == 2 and "FAILED.json" in result.output and "--overwrite" in result.output
    assert (partial_dir(out) / "FAILED.json").read_text() == '{"reason": "earlier"}'
    assert Ledger(db).charges() == []
