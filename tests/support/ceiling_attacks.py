"""Helpers shared by the attack-ceiling attacks (tests/accounting/test_attack_ceiling_attacks.py,
tests/accounting/test_ceiling_never_below_attacks.py, tests/release/test_stated_ceiling_attacks.py,
tests/cli/test_ceiling_display_attacks.py)."""

from __future__ import annotations

from scipy.stats import norm

# noise-bearing events whose noise multiplier is tiny but positive (accepted by ``validate_events``)
TINY = [
    {"mechanism": "gaussian", "noise_multiplier": 1e-300},
    {
        "mechanism": "dp_sgd",
        "sample_rate": 1.0,
        "noise_multiplier": 1e-300,
        "steps": 1,
        "adjacency": "add_remove",
        "accountant": "pld",
    },  # fmt: skip
]


def gaussian_tpr(mu: float, alpha: float) -> float:
    """The exact μ-GDP trade-off curve TPR(α) = Φ(Φ⁻¹(α) + μ) (Dong, Roth & Su 2022, Def. 2.4)."""
    return float(norm.cdf(norm.ppf(alpha) + mu))
