"""dplora.mechanism.clipping: UnitClipAccumulator against a brute-force per-unit clip computed by hand.

Per-example gradients come from a loop of single-example backward passes on a tiny torch MLP; each unit's vector
v_u = Σ_{records i of u} w_i g_i is scaled by min(1, C / (‖v_u‖ + 1e-6)) (or C / (‖v_u‖ + γ) to normalize) and the
scaled vectors are summed, all in float64, and compared with what the accumulator returns.
"""

from __future__ import annotations

import math

import pytest
import torch

from dplora.errors import TrainingFailedError
from dplora.mechanism.clipping import EPS, UnitClipAccumulator

# 10 records in 5 units of 3, 1, 2, 1 and 3 records (unit ids need only be non-decreasing).
UNITS = [0, 0, 0, 2, 5, 5, 6, 9, 9, 9]


def per_example_rows(n: int = len(UNITS), seed: int = 0) -> torch.Tensor:
    """(n, P) float64: row i is example i's flat gradient from its own batch-of-one backward on a tiny MLP."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)).double()
    x = torch.randn(n, 5, generator=gen, dtype=torch.float64) * 2
    y = torch.randint(0, 3, (n,), generator=gen)
    rows = []
    for i in range(n):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1], reduction="sum").backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    return torch.stack(rows)


def hand_clipped_sum(rows, units, clip, *, weights=None, gamma=None):
    """Brute force in float64: (Σ_u factor_u · v_u, [‖v_u‖ for u in order of first appearance])."""
    total, norms = torch.zeros(rows.shape[1], dtype=torch.float64), []
    for u in dict.fromkeys(units):
        v = sum(rows[i].double() * (1.0 if weights is None else weights[i]) for i in range(len(units)) if units[i] == u)
        norm = float(v.norm())
        factor = min(1.0, clip / (norm + 1e-6)) if gamma is None else clip / (norm + gamma)
        total += factor * v
        norms.append(norm)
    return total, torch.tensor(norms, dtype=torch.float64)


def run_batches(rows, units, clip, cuts, **kw):
    """Feed ``rows`` to a fresh accumulator in physical batches split at ``cuts``; returns finish()."""
    acc = UnitClipAccumulator(rows.shape[1], clip, "cpu", normalize_gamma=kw.pop("gamma", None))
    weights, finite = kw.pop("weights", None), kw.pop("finite_rows", None)
    bounds = [0, *cuts, len(units)]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        acc.add(
            rows[a:b].float().clone(),
            torch.tensor(units[a:b]),
            last_unit_continues=b < len(units) and units[b] == units[b - 1],
            row_weight=None if weights is None else torch.tensor(weights[a:b], dtype=torch.float32),
            finite_rows=None if finite is None else finite[a:b],
        )
    total, norms = acc.finish()
    return acc, total.double(), norms.double()


@pytest.fixture(scope="module")
def rows():
    return per_example_rows()


@pytest.fixture(scope="module")
def clip(rows):
    """C between the smallest and the largest unit norm, so that some units are clipped and some are not."""
    _, norms = hand_clipped_sum(rows, UNITS, 1.0)
    lo, hi = float(norms.min()), float(norms.max())
    assert hi > 2 * lo  # the data spans both regimes
    return math.sqrt(lo * hi)


def test_the_reference_is_sharp(rows, clip):
    """The hand reference separates what the planted bugs change: the rows differ and some units exceed C."""
    _, norms = hand_clipped_sum(rows, UNITS, clip)
    assert bool((norms > 1.5 * clip).any()) and bool((norms < clip / 1.5).any())
    assert float((rows[0] - rows[1]).norm()) > 0.1 * float(rows[0].norm())


@pytest.mark.parametrize(
    "cuts",
    [[], [2], [1, 4], [3, 4, 5, 8], list(range(1, 10))],
    ids=["one batch", "unit 0 split", "several", "units on boundaries", "one record per batch"],
)
def test_clipped_sum_and_norms_equal_the_hand_reference(rows, clip, cuts):
    """Any physical batching of the same step gives Σ_u min(1, C/(‖v_u‖+1e-6))·v_u and each unit's norm ‖v_u‖."""
    want, want_norms = hand_clipped_sum(rows, UNITS, clip)
    acc, total, norms = run_batches(rows, UNITS, clip, cuts)
    torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norms, want_norms, rtol=1e-5, atol=1e-6)
    assert acc.units == 5 and int(acc.zeroed) == 0


def test_row_level_units_are_clipped_one_record_each(rows, clip):
    """Every record its own unit (the row-level fast path): the sum of min(1, C/‖g_i‖)·g_i."""
    units = list(range(len(UNITS)))
    want, want_norms = hand_clipped_sum(rows, units, clip)
    _, total, norms = run_batches(rows, units, clip, [4])
    torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norms, rows.norm(dim=1), rtol=1e-5, atol=1e-6)


def test_row_weight_scales_each_record_before_the_unit_is_summed(rows, clip):
    """unit_clipping=mean: v_u = Σ w_i g_i with w_i = 1/records of u, then the unit is clipped."""
    counts = {u: UNITS.count(u) for u in UNITS}
    weights = [1.0 / counts[u] for u in UNITS]
    want, _ = hand_clipped_sum(rows, UNITS, clip / 2, weights=weights)
    _, total, _ = run_batches(rows, UNITS, clip / 2, [2, 7], weights=weights)
    torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-6)
    plain, _ = hand_clipped_sum(rows, UNITS, clip / 2)
    assert float((plain - want).norm()) > 1e-2 * float(want.norm())  # the weights matter here


@pytest.mark.parametrize("gamma", [0.01, 1.0])
def test_normalize_scales_each_unit_to_c_v_over_norm_plus_gamma(rows, clip, gamma):
    want, _ = hand_clipped_sum(rows, UNITS, clip, gamma=gamma)
    _, total, _ = run_batches(rows, UNITS, clip, [2, 5], gamma=gamma)
    torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-6)


def test_records_of_a_unit_are_summed_before_the_clip():
    """[3, 0] and [0, 4] in ONE unit, C = 1: v = [3, 4] → [0.6, 0.8] (clipping each record would give [1, 1])."""
    for cuts in ([], [1]):
        _, total, norms = run_batches(torch.tensor([[3.0, 0.0], [0.0, 4.0]]), [7, 7], 1.0, cuts)
        assert total.tolist() == pytest.approx([0.6, 0.8], rel=1e-5)
        assert norms.tolist() == pytest.approx([5.0], rel=1e-6)


def test_a_clipped_unit_has_norm_exactly_c():
    """A unit above C contributes C·v/(‖v‖ + 1e-6): norm C to within 1e-6 relative (not 1.01 C, not C/‖v‖)."""
    for norm in (1.5, 5.0, 1e4):
        for clip in (0.1, 1.0):
            v = torch.tensor([[0.6 * norm, 0.0, -0.8 * norm]])
            _, total, _ = run_batches(v, [0], clip, [])
            assert float(total.norm()) == pytest.approx(clip * norm / (norm + EPS), rel=1e-6)
            assert float(total.norm()) == pytest.approx(clip, rel=2e-6)
            torch.testing.assert_close(total / total.norm(), v[0].double() / v[0].double().norm())


def test_a_unit_within_c_is_unchanged():
    """A unit with ‖v‖ ≤ C contributes v itself: min(1, ·) never scales a small gradient up to C."""
    v = torch.tensor([[0.3, -0.4, 0.0], [0.01, 0.0, 0.02]])
    for units in ([0, 1], [0, 0]):
        _, total, _ = run_batches(v, units, 1.0, [])
        torch.testing.assert_close(total, v.double().sum(0), rtol=1e-6, atol=1e-8)


def test_one_unit_moves_the_sum_by_at_most_c(rows, clip):
    """Add/remove adjacency: dropping any one unit changes the clipped sum by ≤ C (and by > C/2 for a big unit)."""
    _, full, _ = run_batches(rows, UNITS, clip, [3])
    moved = []
    for u in dict.fromkeys(UNITS):
        keep = [i for i, x in enumerate(UNITS) if x != u]
        _, less, _ = run_batches(rows[keep], [UNITS[i] for i in keep], clip, [])
        moved.append(float((full - less).norm()))
    assert max(moved) <= clip * (1 + 1e-5)
    assert max(moved) >= clip * (1 - 1e-5)  # a clipped unit moves it by exactly C


def test_non_finite_rows_contribute_zero_and_are_counted(rows, clip):
    """A row with NaN/inf, or a record whose loss was non-finite, is replaced by zeros; its unit still counts."""
    bad = rows.clone()
    bad[1, 0] = float("nan")
    bad[3, 2] = float("inf")
    finite = torch.ones(len(UNITS), dtype=torch.bool)
    finite[8] = False
    zeroed = rows.clone()
    zeroed[[1, 3, 8]] = 0.0
    want, want_norms = hand_clipped_sum(zeroed, UNITS, clip)
    acc, total, norms = run_batches(bad, UNITS, clip, [2, 6], finite_rows=finite)
    torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norms, want_norms, rtol=1e-5, atol=1e-6)
    assert int(acc.zeroed) == 3 and acc.units == 5


def test_begin_step_starts_from_zero_and_the_state_is_two_vectors(rows, clip):
    acc = UnitClipAccumulator(rows.shape[1], clip, "cpu", keep_norms=False)
    acc.add(rows[:3].float().clone(), torch.tensor([0, 0, 1]), last_unit_continues=True)
    state = acc.state_tensors()
    assert set(state) == {"clipped_sum", "open_row"} and all(t.shape == (rows.shape[1],) for t in state.values())
    torch.testing.assert_close(state["open_row"].double(), rows[2], rtol=1e-6, atol=1e-7)  # unit 1 stays open
    with pytest.raises(TrainingFailedError, match="still open"):
        acc.finish()
    acc.begin_step()
    assert acc.units == 0 and float(acc.state_tensors()["clipped_sum"].abs().sum()) == 0.0
    acc.add(rows[3:4].float().clone(), torch.tensor([0]))
    total, norms = acc.finish()
    want, _ = hand_clipped_sum(rows[3:4], [0], clip)
    torch.testing.assert_close(total.double(), want, rtol=1e-5, atol=1e-6)
    assert norms.numel() == 0  # keep_norms=False


def test_an_empty_step_finishes_with_a_zero_sum():
    total, norms = UnitClipAccumulator(4, 1.0, "cpu").finish()
    assert total.tolist() == [0.0] * 4 and norms.numel() == 0


@pytest.mark.parametrize(
    ("first", "second", "continues", "match"),
    [
        ([1, 0], None, False, "non-decreasing"),
        ([0, 1], [1], False, "contiguous"),
        ([0, 1], [2], True, "left open"),
    ],
)
def test_unit_order_is_enforced(first, second, continues, match):
    acc = UnitClipAccumulator(2, 1.0, "cpu")
    with pytest.raises(ValueError, match=match):
        acc.add(torch.ones(len(first), 2), torch.tensor(first), last_unit_continues=continues)
        acc.add(torch.ones(len(second), 2), torch.tensor(second))


@pytest.mark.parametrize(
    "kw", [{"num_params": 0}, {"max_grad_norm": 0.0}, {"normalize_gamma": 0.0}, {"normalize_gamma": math.inf}]
)
def test_bad_arguments_are_refused(kw):
    args = {"num_params": 2, "max_grad_norm": 1.0, **kw}
    with pytest.raises(ValueError):
        UnitClipAccumulator(args.pop("num_params"), args.pop("max_grad_norm"), "cpu", **args)


def test_bad_shapes_are_refused():
    acc = UnitClipAccumulator(3, 1.0, "cpu")
    for G, ids in [(torch.ones(2, 4), torch.tensor([0, 1])), (torch.ones(2, 3), torch.tensor([0])),
                   (torch.ones(0, 3), torch.tensor([], dtype=torch.long))]:  # fmt: skip
        with pytest.raises(ValueError):
            acc.add(G, ids)
