"""Attacks on per-unit clipping where finite records of one unit sum past fp32 (dplora.mechanism.clipping).

The guarantee: each unit contributes min(1, C/‖v_u‖)·v_u, so one unit moves the clipped sum by at most C, and a
record's overflow never reaches the noisy update. References are brute force in float64.
"""

from __future__ import annotations

import pytest
import torch

from dplora.mechanism.clipping import UnitClipAccumulator

C = 1.0


def _others(rows: torch.Tensor, ids: torch.Tensor, skip: int) -> torch.Tensor:
    """Brute force: Σ over units u != skip of min(1, C/(‖v_u‖ + 1e-6)) v_u (float64)."""
    total = torch.zeros(rows.shape[1], dtype=torch.float64)
    for u in sorted(set(ids.tolist()) - {skip}):
        v = rows[ids == u].double().sum(0)
        total += v * min(1.0, C / (float(v.norm()) + 1e-6))
    return total


@pytest.mark.parametrize("split", [False, True], ids=["one-physical-batch", "unit-split-across-batches"])
def test_finite_rows_whose_unit_sum_overflows_stay_bounded_by_c(split):
    """Guarantee (clipping.py, per-unit clipping): each unit contributes min(1, C/‖v_u‖)·v_u, so one unit moves the
    clipped sum by at most C, and a record's overflow never reaches the noisy update. Attack: unit 1 has two
    records whose gradient rows are each finite (2e38 < fp32 max, row sums finite, so neither is zeroed) but whose
    unit vector v_1 overflows to inf; its clip factor is 0 and 0·inf = NaN. The clipped sum becomes NaN in that
    coordinate, the noisy update is NaN, the next step stops the run ("non-finite parameter", exit 4): one unit
    decides the exit code, and the other units' contribution is lost. Found: total[0] is NaN (both paths)."""
    g = torch.tensor([[0.3, 0.4, 0.0], [2e38, 0.0, 0.0], [2e38, 0.0, 0.0], [0.0, 0.6, 0.8]])
    ids = torch.tensor([0, 1, 1, 2])
    assert torch.isfinite(g.sum(dim=1)).all()  # every row is finite: nothing for the overflow rule to zero
    acc = UnitClipAccumulator(3, C, "cpu")
    if split:
        acc.add(g[:2].clone(), ids[:2], last_unit_continues=True)
        acc.add(g[2:].clone(), ids[2:])
    else:
        acc.add(g.clone(), ids)
    total, _ = acc.finish()
    assert torch.isfinite(total).all(), f"clipped sum {total.tolist()}"
    assert float((total.double() - _others(g, ids, skip=1)).norm()) <= C + 1e-6  # unit 1 moved it by <= C


def test_finite_rows_whose_unit_sum_overflows_under_normalize_stay_bounded():
    """The same under ``privacy.clipping: normalize`` (factor C/(‖v‖ + γ) = 0 at ‖v‖ = inf, 0·inf = NaN)."""
    g = torch.tensor([[3e38, -3e38], [3e38, -3e38], [0.6, 0.8]])  # row sums are 0: finite, never zeroed
    acc = UnitClipAccumulator(2, C, "cpu", normalize_gamma=0.01)
    acc.add(g.clone(), torch.tensor([0, 0, 1]))
    total, _ = acc.finish()
    assert torch.isfinite(total).all(), f"clipped sum {total.tolist()}"
