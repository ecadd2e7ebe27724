"""Attacks on the ceilings the CLI shows (``dplora ledger show``, ``budget --recommend``'s candidate table): a
noiseless or tiny-noise charge, and rounding to nearest."""

from __future__ import annotations

import json

import pytest
from conftest import ledger_show_json, ledger_with_charges
from support.ceiling_attacks import TINY

from dplora.accounting.ceiling import percent_up
from dplora.cli.budget_view import tpr_cell

SGD = {"mechanism": "dp_sgd", "sample_rate": 0.01, "noise_multiplier": 1.0, "steps": 10,
       "adjacency": "add_remove", "accountant": "pld"}  # fmt: skip


def test_finding_ledger_show_drops_a_noiseless_charge_from_the_population_ceiling(tmp_path):
    """Guarantee 4 through ``dplora ledger show --json``: a population with one DP-SGD charge (q 0.01, σ 1,
    T 10) and one charge whose event is a noise-0 Gaussian count states the DP-SGD charge's ceiling alone
    (1.2 % at 1 % FPR) while its composed ε says n/a. Expected: 1.0 at every FPR or not stated."""
    db = ledger_with_charges(tmp_path / "l.sqlite3", [[SGD], [{"mechanism": "gaussian", "noise_multiplier": 0.0}]])
    res = ledger_show_json(db)
    assert res.exit_code == 0, res.output
    entry = json.loads(res.stdout)["populations"][0]["attack_ceiling"]
    assert not entry["available"] or all(v == 1.0 for v in entry["true_positive_rate_at"].values()), entry


def test_finding_ledger_show_crashes_on_a_noiseless_dp_sgd_charge(tmp_path):
    """Guarantee 5 (and 4): the ledger accepts a ``dp_sgd`` event with σ = 0 (``validate_events`` allows σ >= 0),
    then ``composed_ceiling`` calls ``out_of_range_reason`` whose dp_accounting GaussianPrivacyLoss raises
    ValueError('Standard deviation is not a positive real number: 0.0'); ``ledger show`` catches DploraError only,
    so the CLI exits 1 ('unexpected ValueError'). Expected: exit 0 stating ceiling 1.0 / not stated, or exit 2."""
    db = ledger_with_charges(tmp_path / "l.sqlite3", [[{**SGD, "noise_multiplier": 0.0}]])
    res = ledger_show_json(db)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code in (0, 2), res.output


@pytest.mark.parametrize("event", TINY, ids=["gaussian", "dp_sgd"])
def test_finding_ledger_show_crashes_on_a_tiny_positive_noise_charge(tmp_path, event):
    """Guarantee: bad input exits 2 with one line, no traceback (and the ceiling is never below the curve).
    Input: a ledger charge whose event has noise_multiplier 1e-300 (accepted by ``validate_events``: finite,
    >= 0; so ``Ledger.reserve`` stores it). ``composed_ceiling`` only special-cases σ <= 0; σ = 1e-300 reaches
    dp_accounting (gaussian: unguarded PLD build) or ``out_of_range_reason``'s cost model (dp_sgd), which raise
    OverflowError, and ``ledger show`` calls ``_population_ceiling`` outside ``_user_errors``
    (dplora/cli/ledger.py:225, dplora/accounting/ceiling.py:353-377). Expected: exit 0 with TPR 1.0 (or
    'not stated') at every FPR, or exit 2 with one line. Observed: uncaught OverflowError (a traceback)."""
    db = ledger_with_charges(tmp_path / "l.sqlite3", [[event]])
    result = ledger_show_json(db)
    assert result.exit_code in (0, 2), (result.exit_code, repr(result.exception))
    assert not isinstance(result.exception, OverflowError)


def test_finding_budget_candidate_table_rounds_the_ceiling_to_nearest():
    """Guarantee 1 (rounding in text). ``budget --recommend``'s candidate table prints the 1 % ceiling with
    ``f"{100 * t:.2f} %"`` (dplora/tuning/budget.py:433), nearest, not up. Input: a candidate ceiling
    0.030049 at 1 %. Expected '3.01 %' (never below); observed '3.00 %'."""
    assert tpr_cell({"1%": 0.030049}) == f"{percent_up(0.030049, 2)} %"
