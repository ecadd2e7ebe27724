"""Attacks on the DP mechanism as ``DPMechanism.wrap`` and ``make_mechanism`` build it (dplora/mechanism/): noise
draws and keys, the Poisson sampler, per-unit clipping before the sum, and what ``privacy.enabled`` and the
performance flags may change.

Each test is one attack on a stated guarantee; brute-force references throughout.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from support.lora import PAD, randomize_lora_b
from support.lora import RECORDS as LORA_RECORDS
from support.row_contract import contract_raw
from tiny import save_tiny_model, tiny_llama

from dplora.accounting.events import DpSgdEvent
from dplora.contract.choices import PerSamplePath
from dplora.contract.loader import parse_contract
from dplora.engine import batch as batching
from dplora.engine import distributed
from dplora.mechanism import control, sampling
from dplora.mechanism import optimizer as dpopt
from dplora.mechanism.core import DPMechanism, NonPrivateEvent, PerformanceFlags, make_mechanism
from dplora.recipe.config import RunOptions, compile_run

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


RECORDS = LORA_RECORDS[:6]


GROUPS = [[0, 1, 2], [3], [4, 5]]  # three units: 3, 1 and 2 records


def _lora(seed=0):
    model = tiny_llama(seed=seed)
    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    )
    return randomize_lora_b(peft_model, seed + 1)


def _plan(*, sigma=1.0, clip=1.0, batch=4.0, q=0.5, steps=10, clipping="clip"):
    return SimpleNamespace(
        noise_multiplier=sigma, max_grad_norm=clip, expected_batch_size=batch, sample_rate=q, steps=steps,
        adjacency="add_remove", clipping=clipping,
    )  # fmt: skip


def _wrap(model, plan, *, per_sample="fast", unit_mean=False, private=True):
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.SGD([p for _, p in named], lr=0.0)
    flags = PerformanceFlags(per_sample=PerSamplePath(per_sample))
    if private and plan.noise_multiplier == 0:  # σ = 0 only to read the clipped sum exactly: make_mechanism refuses
        # a private mechanism without noise, so build the frozen object directly (a test-only mechanism)
        event = DpSgdEvent(sample_rate=plan.sample_rate, noise_multiplier=0.0, steps=plan.steps)
        mech = DPMechanism(
            private=True, event=event, plan=plan, unit_mean=unit_mean, flags=flags, world=distributed.SINGLE
        )
    else:
        mech = make_mechanism(plan, flags, distributed.SINGLE, private=private, unit_mean=unit_mean)
    gsm, step_opt, acc = mech.wrap(model, opt)
    return mech, gsm, step_opt, acc, named


@pytest.mark.parametrize("per_sample", ["fast", "opacus"])
def test_empty_steps_draw_once_with_std_sigma_c_and_step_the_accountant(per_sample):
    """K empty steps through DPMechanism.wrap: K draws (nonces), K accountant steps, grad·E ~ N(0, (σC)²)."""
    sigma, clip, E, K = 1.7, 0.6, 5.0, 24
    _, _, dp_opt, acc, named = _wrap(_lora(), _plan(sigma=sigma, clip=clip, batch=E), per_sample=per_sample)
    draws0 = dp_opt.generator.draws
    values = []
    for _ in range(K):
        dp_opt.begin_logical_step(0)
        dp_opt.step()
        values.append(torch.cat([p.grad.detach().flatten() for p in dp_opt.params]) * E)
        dp_opt.zero_grad(set_to_none=True)
    assert dp_opt.generator.draws - draws0 == K
    assert acc.steps == K and acc.history == [(sigma, 0.5, K)]
    x = torch.stack(values).double()
    n = x.numel()  # P·K values, P = 2 layers · 2 modules · (4·16 + 16·4) = 512
    assert n == 512 * K
    std = float(x.std())
    # sample std of n normals: relative s.e. 1/sqrt(2n) ≈ 0.0064; 6 s.e. bound
    assert abs(std / (sigma * clip) - 1) < 6 / math.sqrt(2 * n), std
    assert abs(float(x.mean())) < 6 * sigma * clip / math.sqrt(n)
    # successive steps are not the same draw (distinct nonces)
    assert not torch.equal(values[0], values[1])


def test_two_mechanisms_get_two_noise_keys():
    """A fresh wrap (as on resume) draws a fresh 256-bit key: the first draws of two engines differ."""
    outs = []
    for _ in range(2):
        torch.manual_seed(0)
        np.random.seed(0)
        _, _, dp_opt, _, _ = _wrap(_lora(), _plan())
        dp_opt.begin_logical_step(0)
        dp_opt.step()
        outs.append(torch.cat([p.grad.flatten() for p in dp_opt.params]).clone())
    assert not torch.equal(outs[0], outs[1])
    assert float((outs[0] - outs[1]).abs().max()) > 0.1


def test_sigma_zero_private_plan_is_refused_by_make_mechanism():
    """make_mechanism's docstring: 'Raises ValueError: the plan's q, σ or T cannot make a DP-SGD event'."""
    with pytest.raises(ValueError):
        make_mechanism(_plan(sigma=0.0), PerformanceFlags(), distributed.SINGLE, private=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.mark.parametrize("enabled", [True, False])
def test_the_compiled_mechanism_follows_privacy_enabled(tmp_path, model_dir, enabled):
    contract = parse_contract(contract_raw(tmp_path, model_dir, privacy={"enabled": enabled}))
    plan = _plan(sigma=1.3)
    if not enabled:
        import math as _m

        from dplora.plan.training import TrainingPlan, control_plan

        fields = {f.name: None for f in dataclasses.fields(TrainingPlan)}
        plan = TrainingPlan(**{**fields, "noise_multiplier": 1.3, "sample_rate": 0.25, "steps": 3,
                               "expected_batch_size": 2.0, "epsilon_curve": ((3, 1.0),), "epsilon": 1.0,
                               "target_epsilon": 2.0})  # fmt: skip
        assert _m.isinf(control_plan(plan).epsilon)
    mech = compile_run(contract, plan, RunOptions(), distributed.SINGLE).mechanism()
    assert mech.private is enabled
    if enabled:
        assert isinstance(mech.event, DpSgdEvent) and mech.event.noise_multiplier == 1.3
        _, _, step_opt, acc, _ = _wrap(_lora(), plan)
        assert isinstance(step_opt, dpopt.UnitDPOptimizer) and isinstance(acc, dpopt.StepAccountant)
    else:
        assert isinstance(mech.event, NonPrivateEvent) and mech.plan.noise_multiplier == 0.0
        assert math.isinf(mech.plan.epsilon) and mech.reducer(10, "cpu") is None
        model = _lora()
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
        _, step_opt, counter = mech.wrap(model, opt)
        assert isinstance(step_opt, control.NonPrivateStep) and isinstance(counter, control.StepCounter)


def test_sampler_is_poisson_from_fresh_entropy(monkeypatch):
    """DPMechanism.sampler: PoissonUnitSampler, default_rng() with no seed, per-unit inclusion ≈ q."""
    calls = []
    real = np.random.default_rng

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(sampling.np.random, "default_rng", spy)
    mech = make_mechanism(_plan(q=0.3), PerformanceFlags(), distributed.SINGLE)
    np.random.seed(7)
    torch.manual_seed(7)
    s1, s2 = mech.sampler(2000), mech.sampler(2000)
    assert isinstance(s1, sampling.PoissonUnitSampler)
    assert calls == [((), {}), ((), {})]  # never seeded
    a, b = s1.sample(), s2.sample()
    assert not np.array_equal(a, b)
    counts = np.zeros(2000)
    for _ in range(50):
        counts[s1.sample()] += 1
    # 100000 Bernoulli(0.3) trials: mean 0.3, s.e. 0.00145
    assert abs(counts.mean() / 50 - 0.3) < 0.01
    # batch sizes vary (Poisson, not fixed size)
    sizes = {len(s1.sample()) for _ in range(20)}
    assert len(sizes) > 3


def test_sharded_sampler_union_is_poisson_over_all_units():
    """W = 2: each rank samples only its shard (u mod W == rank); union over ranks covers all N at rate q."""
    mech_worlds = [dataclasses.replace(distributed.SINGLE, rank=r, world_size=2) for r in (0, 1)]
    hits = np.zeros(101)
    for w in mech_worlds:
        assert w.distributed
        s = make_mechanism(_plan(q=0.4), PerformanceFlags(), w).sampler(101)
        assert isinstance(s, sampling.ShardedPoissonSampler)
        for _ in range(200):
            u = s.sample()
            assert np.all(u % 2 == w.rank)
            hits[u] += 1
    assert abs(hits.mean() / 200 - 0.4) < 0.03 and hits.min() > 0


def test_empty_poisson_batches_occur():
    s = make_mechanism(_plan(q=0.001), PerformanceFlags(), distributed.SINGLE).sampler(10)
    assert sum(len(s.sample()) == 0 for _ in range(200)) > 150


def _brute(model, records):
    ref = copy.deepcopy(model)
    out = []
    for ex in records:
        ref.zero_grad(set_to_none=True)
        batching.per_sequence_loss(ref, batching.collate([ex], PAD)).sum().backward()
        out.append(torch.cat([p.grad.flatten() for n, p in ref.named_parameters() if p.requires_grad]).clone())
    return out


@pytest.mark.parametrize("per_sample", ["fast", "opacus"])
@pytest.mark.parametrize("mode", ["sum", "mean", "normalize"])
def test_per_unit_clip_before_sum_through_mechanism(per_sample, mode):
    """σ = 0 so the noise is exactly zero: grad·E equals Σ_units clip(Σ_records g) (not Σ clip(g))."""
    clip = 0.05
    model = _lora()
    per_record = _brute(model, RECORDS)
    plan = _plan(sigma=0.0, clip=clip, batch=3.0, clipping="normalize" if mode == "normalize" else "clip")
    _, gsm, dp_opt, _, _ = _wrap(model, plan, per_sample=per_sample, unit_mean=mode == "mean")
    units = [u for u, g in enumerate(GROUPS) for _ in g]
    records = [RECORDS[r] for g in GROUPS for r in g]
    dp_opt.begin_logical_step(len(GROUPS))
    for start in (0, 4):  # physical batches of 4: unit 2 spans both
        end = min(start + 4, len(records))
        batch = batching.collate(records[start:end], PAD)
        dp_opt.prepare_batch(end - start)
        batching.per_sequence_loss(gsm, batch).sum().backward()
        counts = {u: units.count(u) for u in units}
        dp_opt.accumulate(
            torch.tensor(units[start:end]),
            continues=end < len(units) and units[end] == units[end - 1],
            row_weight=torch.tensor([1.0 / counts[u] for u in units[start:end]]),
        )
    dp_opt.step()
    got = torch.cat([p.grad.flatten() for p in dp_opt.params]) * 3.0
    from dplora.contract.spec import NORMALIZE_GAMMA

    want = torch.zeros_like(per_record[0])
    naive = torch.zeros_like(per_record[0])
    for g in GROUPS:
        s = sum(per_record[r] for r in g)
        if mode == "mean":
            s = s / len(g)
        norm = float(s.norm())
        assert norm > clip  # every unit is clipped: the test can tell the orders apart
        want += s * (clip / (norm + NORMALIZE_GAMMA * clip) if mode == "normalize" else min(1.0, clip / norm))
        for r in g:
            naive += per_record[r] * min(1.0, clip / float(per_record[r].norm()))
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-4), float((got - want).abs().max())
    assert not torch.allclose(got, naive, atol=1e-4)
    assert float(got.norm()) <= len(GROUPS) * clip + 1e-6  # each unit contributes at most C


def test_performance_flags_only_choose_how_the_rows_are_computed():
    """Every PerformanceFlags field (per-example path, physical batch, checkpointing, sharding, threads, dtype,
    attention, checkpoint interval) changes nothing of the event, plan or unit_mean."""
    from dplora.contract.choices import AttnImplementation, Precision, Sharding

    plan = _plan()
    base = make_mechanism(plan, PerformanceFlags(), distributed.SINGLE)
    others = {
        "per_sample": PerSamplePath.OPACUS,
        "physical_batch_size": "auto",
        "gradient_checkpointing": True,
        "sharding": Sharding.FSDP,
        "threads": 3,
        "dtype": Precision.BF16,
        "attn_implementation": AttnImplementation.EAGER,
        "checkpoint_every": 5,
    }
    assert set(others) == {f.name for f in dataclasses.fields(PerformanceFlags)}  # a new flag is added here too
    for name, value in others.items():
        m = make_mechanism(plan, PerformanceFlags(**{name: value}), distributed.SINGLE)
        assert m.event == base.event and m.plan is base.plan and m.private and m.unit_mean == base.unit_mean, name
