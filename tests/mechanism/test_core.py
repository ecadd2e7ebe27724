"""dplora.mechanism.core: the frozen DPMechanism made by make_mechanism, its private and control forms, and the
noise variance Φ = (σC/E)² computed by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent
from dplora.contract.choices import PerSamplePath, ProtectedUnit
from dplora.engine.distributed import SINGLE, World
from dplora.mechanism.control import NonPrivateStep, StepCounter
from dplora.mechanism.core import NonPrivateEvent, make_mechanism, noise_variance
from dplora.mechanism.flags import PerformanceFlags
from dplora.mechanism.noise import CsprngGaussian
from dplora.mechanism.optimizer import StepAccountant, UnitDPOptimizer
from dplora.mechanism.reduction import StepReducer
from dplora.plan.training import TrainingPlan

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")

N, E, SIGMA, C, T = 200, 10, 1.25, 0.8, 30


def training_plan(**kw) -> TrainingPlan:
    """A calibrated-looking plan: N = 200 units, E = 10 so q = E/N = 0.05, σ = 1.25, C = 0.8, T = 30."""
    fields = {
        "protected_unit": ProtectedUnit.ROW,
        "unit_key": None,
        "adjacency": Adjacency.ADD_REMOVE,
        "num_units": N,
        "num_units_source": "contract",
        "expected_batch_size": E,
        "sample_rate": E / N,
        "steps": T,
        "noise_multiplier": SIGMA,
        "noise_source": "contract",
        "max_grad_norm": C,
        "delta": 1e-5,
        "target_epsilon": 8.0,
        "accountant": Accountant.RDP,
        "accountant_version": "test",
        "accountant_note": None,
        "epsilon": 7.5,
        "epsilon_curve": ((T, 7.5),),
    }
    return TrainingPlan(**{**fields, **kw})


@pytest.mark.parametrize(("sigma", "clip", "expected"), [(1.0, 1.0, 1.0), (1.25, 0.8, 10.0), (0.0, 3.0, 4.0),
                                                         (2.0, 0.0, 7.0), (0.6, 2.5, 0.5)])  # fmt: skip
def test_noise_variance_is_sigma_c_over_e_squared(sigma, clip, expected):
    plan = training_plan(noise_multiplier=sigma, max_grad_norm=clip, expected_batch_size=expected)
    assert noise_variance(plan) == pytest.approx((sigma * clip / expected) ** 2, rel=1e-12)


@pytest.mark.parametrize(
    "kw",
    [
        {"expected_batch_size": 0},
        {"expected_batch_size": -1.0},
        {"expected_batch_size": math.inf},
        {"noise_multiplier": -0.1},
        {"noise_multiplier": math.nan},
        {"max_grad_norm": -1.0},
        {"max_grad_norm": math.inf},
    ],
)
def test_noise_variance_refuses_bad_values(kw):
    with pytest.raises(ValueError):
        noise_variance(training_plan(**kw))


def test_private_mechanism_carries_the_plans_dp_sgd_event():
    plan = training_plan()
    mech = make_mechanism(plan, PerformanceFlags(), SINGLE, unit_mean=True)
    assert mech.private and mech.unit_mean and mech.plan is plan and mech.world is SINGLE
    assert mech.event == DpSgdEvent(sample_rate=0.05, noise_multiplier=SIGMA, steps=T, adjacency=Adjacency.ADD_REMOVE)
    assert mech.noise_variance == pytest.approx((SIGMA * C / E) ** 2, rel=1e-12)
    assert mech.plan.expected_batch_size == plan.sample_rate * plan.num_units  # the public normaliser q·N
    with pytest.raises(dataclasses.FrozenInstanceError):
        mech.private = False  # type: ignore[misc]
    replace_one = make_mechanism(training_plan(adjacency=Adjacency.REPLACE_ONE), PerformanceFlags(), SINGLE)
    assert replace_one.event.adjacency is Adjacency.REPLACE_ONE


@pytest.mark.parametrize("sigma", [0.0, -1.0])
def test_a_private_mechanism_without_noise_is_refused(sigma):
    with pytest.raises(ValueError, match="noise_multiplier"):
        make_mechanism(training_plan(noise_multiplier=sigma), PerformanceFlags(), SINGLE)


def test_the_control_has_the_same_steps_q_and_normaliser_and_no_noise():
    plan = training_plan()
    ctl = make_mechanism(plan, PerformanceFlags(), SINGLE, private=False)
    assert not ctl.private and isinstance(ctl.event, NonPrivateEvent) and ctl.event.steps == T
    assert ctl.plan.noise_multiplier == 0.0 and ctl.plan.epsilon == math.inf
    assert (ctl.plan.sample_rate, ctl.plan.steps, ctl.plan.expected_batch_size) == (0.05, T, E)
    assert ctl.noise_variance == 0.0
    assert ctl.event.to_dict() == {"mechanism": "none", "event": "NonPrivate", "steps": T}
    assert type(ctl.event.to_dp_accounting()).__name__ == "NonPrivateDpEvent"
    assert ctl.reducer(8, "cpu") is None and ctl.reducer is not None
    model = torch.nn.Linear(3, 2)
    fwd, step, counter = ctl.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert fwd is model and isinstance(step, NonPrivateStep) and isinstance(counter, StepCounter)
    assert step.expected_batch_size == E


def test_reducer_and_sampler_follow_the_world():
    mech = make_mechanism(training_plan(), PerformanceFlags(), SINGLE)
    assert mech.reducer(8, "cpu") is None
    two = make_mechanism(training_plan(), PerformanceFlags(), World(rank=1, world_size=2, backend="gloo"))
    reducer = two.reducer(8, "cpu")
    assert isinstance(reducer, StepReducer) and reducer.P == 8
    picks = [two.sampler(N).sample() for _ in range(20)]
    assert all(set(p.tolist()) <= set(range(1, N, 2)) for p in picks)  # rank 1's shard of the units
    assert sum(len(p) for p in picks) > 0
    bad = dataclasses.replace(mech, plan=training_plan(sample_rate=1.5))
    with pytest.raises(ValueError):
        bad.sampler(N)


def test_wrap_makes_the_unit_dp_optimizer_with_the_plans_sigma_c_and_e():
    """The private wrap: a UnitDPOptimizer (σ, C, E of the plan, ChaCha20 noise) and an accountant that counts one
    step per logical step, empty batches included; the step's grad is noise alone with std σC/E."""
    mech = make_mechanism(training_plan(), PerformanceFlags(per_sample=PerSamplePath.OPACUS), SINGLE)
    model = torch.nn.Linear(40, 50)
    _, opt, accountant = mech.wrap(model, torch.optim.SGD(model.parameters(), lr=0.0))
    assert isinstance(opt, UnitDPOptimizer) and isinstance(accountant, StepAccountant)
    assert isinstance(opt.generator, CsprngGaussian)
    assert (opt.noise_multiplier, opt.max_grad_norm, opt.expected_batch_size) == (SIGMA, C, E)
    opt.begin_logical_step(0)
    opt.step()
    grad = torch.cat([p.grad.reshape(-1) for p in opt.params]).double()
    n, sd = grad.numel(), math.sqrt(mech.noise_variance)
    assert abs(float(grad.std()) / sd - 1) < 6 / math.sqrt(2 * n)  # 6 SE ≈ 9 %: fresh OS-entropy key, never flaky
    assert accountant.steps == 1 and accountant.history == [(SIGMA, 0.05, 1)]
