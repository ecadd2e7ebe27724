"""Issue 41.4 (with issue 49's line): a record's overflow is a zero contribution, not a failure.

A record whose loss or per-example gradient is non-finite contributes ZERO to its unit's vector; its row is replaced
after it is formed (a NaN times a zero weight is still NaN); the unit is still counted, clipped and summed; noise
and the accountant step happen as usual; the count of zeroed records is private. Only a non-finite *noisy* update
(a DP output) stops the run, and a run that stops at step k is charged k steps.
"""

from __future__ import annotations

import pytest
import torch
from support.overflow import C

from dplora.mechanism.clipping import UnitClipAccumulator


def _clipped(rows: list[torch.Tensor]) -> torch.Tensor:
    """Brute force: Σ_u min(1, C/(‖v_u‖ + 1e-6)) v_u over units given as lists of rows."""
    total = torch.zeros_like(rows[0][0])
    for unit in rows:
        v = torch.stack(unit).sum(0)
        total += v * min(1.0, C / (float(v.norm()) + 1e-6))
    return total


@pytest.mark.parametrize("grouped", [False, True], ids=["row-level", "units-with-several-records"])
def test_a_non_finite_row_contributes_zero_and_its_unit_still_counts(grouped):
    g = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([0, 1, 1, 2, 3, 3]) if grouped else torch.arange(6)
    bad = g.clone()
    bad[1, 2] = float("nan")  # an overflow in one coordinate of record 1
    bad[4] = float("inf")  # every coordinate of record 4
    acc = UnitClipAccumulator(5, C, "cpu")
    acc.add(bad, ids)
    total, norms = acc.finish()
    zeroed = g.clone()
    zeroed[[1, 4]] = 0.0
    units = [[zeroed[i] for i in range(6) if int(ids[i]) == u] for u in sorted(set(ids.tolist()))]
    assert torch.allclose(total, _clipped(units), atol=1e-6)
    assert torch.isfinite(total).all() and int(acc.zeroed) == 2
    assert acc.units == len(units) and len(norms) == len(units)  # every unit counted, the zeroed ones too


def test_a_non_finite_loss_flag_zeroes_a_finite_row_and_mean_weights_stay_per_unit():
    """``finite_rows`` False zeroes a row whose gradient is finite; under unit_clipping: mean the unit's weights
    stay 1/records (the zeroed record still counts in its unit's size: a public-shape rule, not data-dependent)."""
    g = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    ids, w = torch.tensor([0, 0, 1, 1]), torch.full((4,), 0.5)
    acc = UnitClipAccumulator(3, C, "cpu")
    acc.add(g.clone(), ids, row_weight=w, finite_rows=torch.tensor([True, False, True, True]))
    total, _ = acc.finish()
    expected = _clipped([[0.5 * g[0], torch.zeros(3)], [0.5 * g[2], 0.5 * g[3]]])
    assert torch.allclose(total, expected, atol=1e-6) and int(acc.zeroed) == 1


def test_a_unit_split_across_physical_batches_with_an_overflow():
    """The open row of a unit that spans two physical batches never takes in the NaN."""
    g = torch.randn(4, 3, generator=torch.Generator().manual_seed(2))
    bad = g.clone()
    bad[1] = float("nan")
    acc = UnitClipAccumulator(3, C, "cpu")
    acc.add(bad[:2], torch.tensor([0, 0]), last_unit_continues=True)
    acc.add(bad[2:], torch.tensor([0, 1]))
    total, _ = acc.finish()
    assert torch.allclose(total, _clipped([[g[0], torch.zeros(3), g[2]], [g[3]]]), atol=1e-6)
