"""``dplora ledger show`` states the attack ceiling of a population's charges composed (issue 46 item 1).

Reference: two charges of F7 row 2's mechanism (q 32/4214, σ 0.417, T 12) compose to the same mechanism with
T = 24, so the composed ceiling must equal :func:`attack_ceiling` at T = 24 (PLD composition vs self-composition,
same interval) and lie above one release's 0.0306 at 1 % FPR.
"""

from __future__ import annotations

import json

import pytest
from conftest import ledger_show_json, ledger_with_charges

from dplora.accounting.ceiling import attack_ceiling
from dplora.accounting.events import DpSgdEvent

Q, SIGMA, T = 32 / 4214, 0.417, 12
EVENT = {"mechanism": "dp_sgd", "sample_rate": Q, "noise_multiplier": SIGMA, "steps": T,
         "adjacency": "add_remove", "accountant": "pld"}  # fmt: skip


def test_two_charges_compose_to_the_ceiling_of_twice_the_steps(tmp_path):
    db = ledger_with_charges(tmp_path / "l.sqlite3", [[EVENT], [EVENT]], epsilon="7.95")
    res = ledger_show_json(db)
    assert res.exit_code == 0, res.output
    entry = json.loads(res.stdout)["populations"][0]["attack_ceiling"]
    assert entry["available"] is True and "every charge" in entry["scope"]
    twice = attack_ceiling(DpSgdEvent(sample_rate=Q, noise_multiplier=SIGMA, steps=2 * T))
    assert list(entry["true_positive_rate_at"].values()) == pytest.approx(list(twice.tprs), abs=2e-4)
    assert entry["true_positive_rate_at"]["1%"] > 0.0306 + 0.002
