"""privacy.clipping: normalize against a one-unit-at-a-time reference, and the lr schedules against their formulas."""

from __future__ import annotations

import math

import pytest
import torch

from dplora.mechanism.clipping import UnitClipAccumulator

C, GAMMA = 1.5, 0.015


def _reference(G, ids):
    out = torch.zeros(G.shape[1], dtype=torch.float64)
    contributions = []
    for u in sorted(set(ids)):
        v = G[[i for i, x in enumerate(ids) if x == u]].double().sum(0)
        c = C * v / (v.norm() + GAMMA)
        contributions.append(c.norm().item())
        out += c
    return out, contributions


def test_normalize_matches_brute_force_and_each_unit_is_below_c():
    g = torch.Generator().manual_seed(0)
    G = torch.randn(9, 7, generator=g)
    G[0] *= 1e-9  # a near-zero gradient
    G[4] *= 1e6  # a huge one
    ids = [0, 1, 1, 2, 3, 3, 3, 4, 5]
    acc = UnitClipAccumulator(7, C, "cpu", normalize_gamma=GAMMA)
    acc.begin_step()
    acc.add(G[:5].clone(), torch.tensor(ids[:5]), last_unit_continues=True)  # unit 3 spans two physical batches
    acc.add(G[5:].clone(), torch.tensor(ids[5:]))
    total, _ = acc.finish()
    ref, contributions = _reference(G, ids)
    assert torch.allclose(total.double(), ref, rtol=1e-5, atol=1e-6)
    assert all(c < C for c in contributions)
    assert max(contributions) > 0.99 * C  # the huge unit: just under C, never at or over it


def test_normalize_row_level_path_and_sensitivity():
    G = torch.tensor([[3.0, 4.0], [0.0, 1e-8], [1e8, 0.0]])
    acc = UnitClipAccumulator(2, C, "cpu", normalize_gamma=GAMMA)
    acc.begin_step()
    acc.add(G.clone(), torch.tensor([0, 1, 2]))
    total, _ = acc.finish()
    ref, contributions = _reference(G, [0, 1, 2])
    assert torch.allclose(total.double(), ref, rtol=1e-6)
    assert all(c < C for c in contributions)
    # clip (the default) differs: the small unit is not scaled up
    clip = UnitClipAccumulator(2, C, "cpu")
    clip.begin_step()
    clip.add(G.clone(), torch.tensor([0, 1, 2]))
    assert not torch.allclose(clip.finish()[0], total)


def test_normalize_gamma_must_be_positive():
    with pytest.raises(ValueError, match="γ > 0"):
        UnitClipAccumulator(2, C, "cpu", normalize_gamma=0.0)


def test_make_private_reads_the_plans_clipping():
    from types import SimpleNamespace

    from dplora.mechanism.optimizer import normalize_gamma

    assert normalize_gamma(SimpleNamespace(clipping="normalize", max_grad_norm=2.0)) == pytest.approx(0.02)
    assert normalize_gamma(SimpleNamespace(clipping="clip", max_grad_norm=2.0)) is None


def _formula(kind, step, warmup, total):
    if step < warmup:
        return step / max(1, warmup)
    if kind == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    if kind == "linear":
        return max(0.0, (total - step) / max(1, total - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
def test_schedules_match_their_formulas_step_by_step(kind):
    from dplora.engine.schedule import make_scheduler, step_scheduler

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=0.1)
    sched = make_scheduler(opt, schedule=kind, warmup_steps=3, total_steps=12)
    for step in range(12):
        # logical step s trains at the formula's s + 1 over T + 1 steps: never at rate 0
        assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * _formula(kind, step + 1, 3, 13), abs=1e-12)
        assert opt.param_groups[0]["lr"] > 0
        opt.step()
        sched.step()
    # resume: a fresh scheduler fast-forwarded to step 7 gives step 7's rate
    opt2 = torch.optim.AdamW([p], lr=0.1)
    s2 = make_scheduler(opt2, schedule=kind, warmup_steps=3, total_steps=12)
    step_scheduler(s2, 7)
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.1 * _formula(kind, 8, 3, 13), abs=1e-12)


def test_schedule_and_clipping_in_the_plan(tmp_path, tiny_model_dir, tickets_csv):
    from conftest import contract_dict

    from dplora.contract.loader import parse_contract
    from dplora.plan.training import make_plan

    raw = contract_dict(
        tiny_model_dir,
        tickets_csv,
        tmp_path / "o",
        privacy={"clipping": "normalize"},
        training={"lr_schedule": "linear", "warmup_steps": 1, "weight_decay": 0.01},
    )
    plan = make_plan(parse_contract(raw), num_units=120, num_units_source="contract")
    d = plan.to_dict()
    assert (d["clipping"], d["lr_schedule"], d["warmup_steps"], d["weight_decay"]) == ("normalize", "linear", 1, 0.01)


@pytest.mark.parametrize("scale", [1e-12, 1e-3, 1.0, 1e3, 1e8])
def test_one_units_normalized_contribution_is_at_most_c_in_fp32(scale):
    """The accumulator's own output for one unit (not a float64 reference): norm C·‖g‖/(‖g‖+γ) ≤ C up to fp32
    rounding (as for clip), and below C by about γ/‖g‖ where that is above rounding."""
    g = torch.Generator().manual_seed(1)
    G = torch.randn(3, 11, generator=g) * scale
    acc = UnitClipAccumulator(11, C, "cpu", normalize_gamma=GAMMA)
    acc.begin_step()
    acc.add(G.clone(), torch.tensor([0, 0, 0]))
    total, norms = acc.finish()
    n = float(G.double().sum(0).norm())
    assert float(total.double().norm()) == pytest.approx(C * n / (n + GAMMA), rel=1e-5, abs=1e-12)
    assert float(total.double().norm()) <= C * (1 + 1e-6)
