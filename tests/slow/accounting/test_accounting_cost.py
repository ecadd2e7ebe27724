"""The slow tier of tests/accounting/test_accounting_cost.py, whose docstring describes the module."""

from __future__ import annotations

import pytest

import dplora.accounting as accounting


def _dp_accounting_epsilon(q, sigma, steps, delta, adjacency) -> float:
    """dp_accounting's own PLDAccountant (default interval 1e-4), the peer library's number."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    relation = {
        "add_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        "replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE,
    }[adjacency]
    acc = pld_privacy_accountant.PLDAccountant(relation)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize(
    ("q", "sigma", "steps", "adjacency", "expected"),
    [
        (0.2, 0.5, 3, "add_remove", 11.5154),  # main: "PLD would cost 4.62e+06 work units (limit 4.19e+06"
        (0.01, 0.35, 120, "add_remove", 18.6977),  # main: 7.91e+06 work units
        (0.01, 0.35, 120, "replace_one", 19.2201),  # main: 6.97e+06 work units; refused under replace-one
    ],
)
def test_issue_cases_are_answered_with_dp_accountings_value(q, sigma, steps, adjacency, expected):
    got = accounting.epsilon(
        sample_rate=q, noise_multiplier=sigma, steps=steps, delta=1e-5, accountant="pld", adjacency=adjacency
    )
    reference = _dp_accounting_epsilon(q, sigma, steps, 1e-5, adjacency)
    assert got == pytest.approx(reference, rel=1e-9)
    assert reference == pytest.approx(expected, abs=1e-3)  # dp-accounting 0.6.0's value, measured
