"""The slow tier of tests/mechanism/test_adambc.py, whose docstring describes the module."""

from __future__ import annotations

import pytest


def test_train_with_dp_adambc_uses_the_plans_phi_and_records_it(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """``dplora train`` with ``training.optimizer: dp_adambc``: the optimizer gets Φ = (σC/E)² of the signed plan,
    the run releases, and its signed contract.yaml names the optimizer."""
    from conftest import release_statement, train_tiny

    from dplora.mechanism import adambc

    seen = []

    class Spy(adambc.DPAdamBC):
        def __init__(self, params, **kw):
            seen.append(kw["noise_variance"])
            super().__init__(params, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(adambc, "DPAdamBC", Spy)
    try:
        result, out = train_tiny(
            tmp_path, tiny_model_dir, tickets_csv, signing_key, training={"optimizer": "dp_adambc"}
        )
    finally:
        mp.undo()
    assert result.exit_code == 0, result.output
    record = release_statement(out)["predicate"]
    mech = record["mechanism"]
    noise_std, expected = mech["noise_std"], mech["normalizer"]["expected_units_per_step"]
    assert noise_std == record["accounting"]["noise_multiplier"] * mech["max_grad_norm"]
    assert seen and seen[-1] == pytest.approx((noise_std / expected) ** 2, rel=1e-12)
    assert "optimizer: dp_adambc" in (out / "contract.yaml").read_text()  # the signed contract names it
