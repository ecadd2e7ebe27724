"""Helpers shared by tests/accounting/test_accounting.py and its slow tier under tests/slow/."""

from __future__ import annotations

import functools

from dplora.accounting import calibrate_noise, epsilon
from dplora.accounting.backends import AccountingNumericalError

TOL = 0.02


MNIST_Q = 256 / 60000


def eps(accountant, q, sigma, steps, delta=1e-5, adjacency="add_remove"):
    """ε of the public (q, σ, T, δ, adjacency) under ``accountant`` (dplora.accounting.epsilon)."""
    common = dict(sample_rate=q, steps=steps, delta=delta, accountant=accountant, adjacency=adjacency)
    return epsilon(noise_multiplier=sigma, **common)


def calib(accountant, target, q, steps, delta=1e-5, adjacency="add_remove"):
    """σ calibrated to ``target`` ε for the public (q, T, δ, adjacency) (dplora.accounting.calibrate_noise)."""
    common = dict(sample_rate=q, steps=steps, delta=delta, accountant=accountant, adjacency=adjacency)
    return calibrate_noise(target_epsilon=target, **common)


PINNED_FAST = [
    # (case, accountant, q, σ, T, δ, adjacency, expected ε)
    ("NOTES RDP T=300", "rdp", 0.01, 1.0, 300, 1e-5, "add_remove", 1.451),
    ("NOTES RDP T=600", "rdp", 0.01, 1.0, 600, 1e-5, "add_remove", 1.748),
    ("A4 MNIST RDP", "rdp", MNIST_Q, 1.1, 14062, 1e-5, "add_remove", 2.597),
    ("A4 MNIST RDP δ=1e-7", "rdp", MNIST_Q, 1.1, 14062, 1e-7, "add_remove", 3.185),
    ("A4 σ=4 RDP", "rdp", 0.01, 4.0, 10000, 1e-5, "add_remove", 1.035),
    ("A7 q=1 RDP", "rdp", 1.0, 1.0, 10, 1e-5, "add_remove", 19.05),
    ("A8 RDP", "rdp", 0.08, 1.0, 100, 1e-5, "add_remove", 6.34),
    ("STYLE RDP", "rdp", 0.01, 1.1, 6000, 1e-5, "add_remove", 4.25),
    ("A10 PLD add/remove", "pld", 0.01, 1.0, 1000, 1e-5, "add_remove", 1.83),
    ("A10 PLD replace-one", "pld", 0.01, 1.0, 1000, 1e-5, "replace_one", 2.84),
    ("A4 MNIST PLD", "pld", MNIST_Q, 1.1, 14062, 1e-5, "add_remove", 2.382),
    ("A4 MNIST PLD δ=1e-7", "pld", MNIST_Q, 1.1, 14062, 1e-7, "add_remove", 2.984),
    ("A10 MNIST PLD replace-one", "pld", MNIST_Q, 1.1, 14062, 1e-5, "replace_one", 4.22),
    ("A4 σ=4 PLD", "pld", 0.01, 4.0, 10000, 1e-5, "add_remove", 0.947),
    ("A3 PLD", "pld", 0.2, 1.0, 10, 1e-5, "add_remove", 4.984),
    ("A8 PLD", "pld", 0.08, 1.0, 100, 1e-5, "add_remove", 5.61),
    ("A8 micro-batch q (wrong) PLD", "pld", 0.01, 1.0, 100, 1e-5, "add_remove", 0.72),
    ("STYLE PLD", "pld", 0.01, 1.1, 6000, 1e-5, "add_remove", 3.90),
    ("NOTES PRV T=300", "prv", 0.01, 1.0, 300, 1e-5, "add_remove", 1.078),
    ("NOTES PRV T=600", "prv", 0.01, 1.0, 600, 1e-5, "add_remove", 1.449),
]


PINNED = {p[0]: p[1:] for p in PINNED_FAST}


@functools.cache
def observed(case: str) -> float:
    """ε for a pinned case, computed once per session (the relations test reuses it)."""
    accountant, q, sigma, steps, delta, adjacency, _ = PINNED[case]
    return eps(accountant, q, sigma, steps, delta, adjacency)


def broken_prv(event, delta, *args):
    raise AccountingNumericalError("Discrete mean differs from continuous mean")


# PLD's pinned cases take seconds each (the fine discretization); RDP and PRV ones stay in the fast tier.
SLOW_PINNED = {
    "A3 PLD",
    "A8 PLD",
    "A8 micro-batch q (wrong) PLD",
    "A10 PLD add/remove",
    "A10 PLD replace-one",
    "STYLE PLD",
}


GRID = [(e, q, t) for e in (1.0, 3.0, 8.0) for q in (0.004, 0.01, 0.1) for t in (100, 1000, 14062)]


# The grid points whose calibration takes longest (large ε with few steps: RDP's order search runs longest).
SLOW_A1_GRID = [
    (3.0, 0.01, 100),
    (3.0, 0.1, 100),
    (8.0, 0.004, 100),
    (8.0, 0.004, 1000),
    (8.0, 0.01, 100),
    (8.0, 0.01, 1000),
    (8.0, 0.1, 100),
]


def check_grid_point(target: float, q: float, steps: int) -> None:
    """A1: RDP's calibrated σ never overshoots the target ε, and is not wastefully large."""
    sigma = calib("rdp", target, q, steps)
    assert eps("rdp", q, sigma, steps) <= target
    # and it is not wastefully large: 1% less noise already overshoots
    assert eps("rdp", q, sigma / 1.01, steps) > target
