"""Attacks on the attack ceiling a release states (dplora.release.card, dplora.release.verify): the card's sentence
and verify's recomputation after an attached private-data audit, and a recorded ceiling edited down within verify's
tolerance. The reference is the exact Gaussian trade-off curve at q = 1 (Dong, Roth & Su 2022, Def. 2.4).
"""

from __future__ import annotations

import math
import re

import pytest
from support.ceiling_attacks import gaussian_tpr

from dplora.accounting.backends import exact_epsilon
from dplora.accounting.ceiling import ceiling_entry, percent_up
from dplora.accounting.events import DpSgdEvent
from dplora.audit.attach import composed_claim
from dplora.release.card import ceiling_line
from dplora.release.verify import check_attack_ceiling


def test_finding_attached_private_audit_ceiling_ignores_the_audit_run():
    """After ``dplora audit --attach`` of a private-data audit, the record claims release + audit composed, but its
    attack ceiling (card sentence and verify's recomputation) is the release run's alone: an attacker holding the
    record (adapter + the audit section's outputs from a second run on the same units) can beat it.

    Both runs: q = 1, σ = 2, T = 4, add/remove, so each is μ = 1 Gaussian DP and together μ = √2 (exact).
    """
    event = DpSgdEvent(sample_rate=1.0, noise_multiplier=2.0, steps=4)
    eps = exact_epsilon(event, 1e-5, 4)
    record = {
        "mechanism": {**event.to_dict(), "max_grad_norm": 1.0},
        "privacy": {"protected_unit": "user", "adjacency": "add_remove"},
        "accounting": {
            "epsilon_spent": eps,
            "delta": 1e-5,
            "sample_rate": 1.0,
            "noise_multiplier": 2.0,
            "steps_done": 4,
            "accountant": "rdp",
        },
        "attack_ceiling": ceiling_entry(event, use_cache=False),
    }
    section = {
        "data": {"source": "private"},
        "claimed_epsilon": eps,
        "mechanism": {"delta": 1e-5, "sample_rate": 1.0, "noise_multiplier": 2.0, "steps": 4, "accountant": "rdp"},
    }
    composed = composed_claim(record, section)
    assert composed is not None and composed["total_epsilon"] > eps  # the record does claim the composition
    attached = {**record, "audit": {**section, "composed": composed}}
    truth = gaussian_tpr(math.sqrt(2.0), 0.01)  # 0.1813: two μ = 1 runs on the same units
    card = ceiling_line(attached)
    stated = float(re.search(r"exceed ([0-9.]+) % true positives at 1 %", card).group(1)) / 100
    recomputed, _ = check_attack_ceiling(attached)
    assert stated >= truth - 1e-3, f"card states {stated:.4f} at 1 % FPR; the record's mechanisms allow {truth:.4f}"
    assert recomputed["true_positive_rate_at"]["1%"] >= truth - 1e-4


def test_finding_verify_accepts_a_ceiling_edited_down_within_its_tolerance():
    """Guarantee 3 (and 1). ``same_ceiling`` accepts a recorded TPR up to 1e-4 BELOW the recomputed one (a two-sided
    tolerance, dplora/accounting/ceiling.py:453), and the card states the recorded value. Input: q = 1,
    σ = 2.2402, T = 1 (exact 1 % TPR 0.03005, card '3.1 %'), every recorded TPR lowered by 9e-5 (1 %: 0.02996,
    card '3.0 %'). Expected: verify fails (the recorded ceiling is below the mechanism's); observed: it passes."""
    event = DpSgdEvent(sample_rate=1.0, noise_multiplier=2.2402, steps=1)
    true = ceiling_entry(event, use_cache=False)
    edited = {**true, "true_positive_rate_at": {k: v - 9e-5 for k, v in true["true_positive_rate_at"].items()}}
    assert percent_up(edited["true_positive_rate_at"]["1%"]) != percent_up(true["true_positive_rate_at"]["1%"])
    predicate = {
        "mechanism": {"sample_rate": 1.0, "noise_multiplier": 2.2402, "steps": 1, "adjacency": "add_remove"},
        "attack_ceiling": edited,
    }
    with pytest.raises(Exception, match="attack ceiling"):
        check_attack_ceiling(predicate)
