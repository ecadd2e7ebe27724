"""Helpers shared by tests/accounting/test_accounting_exact.py and its slow tier under tests/slow/."""

from __future__ import annotations

from dplora.accounting import epsilon


def pld(q, sigma, steps, adjacency="add_remove", delta=1e-5):
    return epsilon(
        sample_rate=q, noise_multiplier=sigma, steps=steps, delta=delta, accountant="pld", adjacency=adjacency
    )
