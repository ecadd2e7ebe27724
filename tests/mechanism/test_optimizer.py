"""dplora.mechanism.optimizer: UnitDPOptimizer's step against a brute-force reference with real values.

The reference is computed by hand in float64: per-example gradients from a loop of batch-of-one backward passes,
each unit's summed gradient scaled by min(1, C/‖v_u‖), the units summed, plus the noise N(0, (σC)² I) that a
ChaCha20 generator with a fixed key draws (the same key drawn again gives the same values, so the noise is known
exactly), all divided by the public normaliser E, never by the realised number of units.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from support.lora import randomize_lora_b
from tiny import tiny_llama

from dplora.engine import batch as batching
from dplora.engine.perexample import opacus_module
from dplora.mechanism import optimizer as dpopt
from dplora.mechanism.noise import CsprngGaussian

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)

KEY = bytes(range(7, 39))
UNITS = [0, 0, 0, 1, 2, 2, 3, 4, 4, 4]  # 5 units of 3, 1, 2, 1, 3 records
N_IN, N_OUT = 5, 3


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(N_IN, 4), torch.nn.Tanh(), torch.nn.Linear(4, N_OUT))


def data(n: int = len(UNITS), seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, N_IN, generator=gen) * 2, torch.randint(0, N_OUT, (n,), generator=gen)


def per_example_rows(model, x, y) -> torch.Tensor:
    """(n, P) float64: one batch-of-one backward per example on a float64 copy of ``model``."""
    ref = mlp()
    ref.load_state_dict(model.state_dict())
    ref = ref.double()
    rows = []
    for i in range(len(x)):
        ref.zero_grad()
        F.cross_entropy(ref(x[i : i + 1].double()), y[i : i + 1], reduction="sum").backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in ref.parameters()]))
    return torch.stack(rows)


def hand_clipped_sum(rows, units, clip, *, mean=False) -> torch.Tensor:
    total = torch.zeros(rows.shape[1], dtype=torch.float64)
    for u in dict.fromkeys(units):
        members = [i for i, x in enumerate(units) if x == u]
        v = rows[members].sum(0) / (len(members) if mean else 1)
        total += v * min(1.0, clip / float(v.norm()))
    return total


def known_noise(draw: int, size: int, std: float) -> torch.Tensor:
    """Draw number ``draw`` of a fresh generator keyed with KEY: the noise the optimizer under test adds."""
    gen = CsprngGaussian(key=KEY)
    for _ in range(draw):
        gen.normal(size, std)
    return gen.normal(size, std).double()


def dp_optimizer(model, *, sigma, clip, expected, lr=0.0, unit_mean=False):
    gsm = opacus_module(model)
    opt = dpopt.UnitDPOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr),
        noise_multiplier=sigma,
        max_grad_norm=clip,
        expected_batch_size=expected,
        generator=CsprngGaussian(key=KEY),
        unit_mean=unit_mean,
    )
    return gsm, opt


def logical_step(gsm, opt, x, y, units, physical, *, apply=True) -> torch.Tensor:
    """One logical step in physical batches of ``physical`` records; returns the flat .grad (P,) float64."""
    opt.begin_logical_step(len(set(units)))
    counts = {u: units.count(u) for u in units}
    for a in range(0, len(units), physical):
        b = min(a + physical, len(units))
        opt.prepare_batch(b - a)
        F.cross_entropy(gsm(x[a:b]), y[a:b], reduction="sum").backward()
        opt.accumulate(
            torch.tensor(units[a:b]),
            continues=b < len(units) and units[b] == units[b - 1],
            row_weight=torch.tensor([1.0 / counts[u] for u in units[a:b]]),
        )
    opt.step() if apply else opt.pre_step()
    return torch.cat([p.grad.reshape(-1) for p in opt.params]).double()


@pytest.fixture(scope="module")
def setup():
    model = mlp()
    x, y = data()
    rows = per_example_rows(model, x, y)
    norms = torch.stack([rows[[i for i, x in enumerate(UNITS) if x == u]].sum(0).norm() for u in range(5)])
    clip = float(norms.median())  # some units are clipped, some are not
    assert float(norms.max()) > 1.5 * clip and float(norms.min()) < clip / 1.3
    return model.state_dict(), x, y, rows, clip


@pytest.mark.parametrize("physical", [3, 4, 10])
@pytest.mark.parametrize("unit_mean", [False, True])
def test_grad_is_clipped_sum_plus_one_sigma_c_draw_over_e(setup, physical, unit_mean):
    """p.grad = (Σ_u clip_C(v_u) + N(0, (σC)² I)) / E, to float32 precision, E = 6.5 ≠ 5 realised units."""
    state, x, y, rows, clip = setup
    model = mlp()
    model.load_state_dict(state)
    sigma, E = 0.7, 6.5
    gsm, opt = dp_optimizer(model, sigma=sigma, clip=clip, expected=E, unit_mean=unit_mean)
    grad = logical_step(gsm, opt, x, y, UNITS, physical, apply=False)
    clipped = hand_clipped_sum(rows, UNITS, clip, mean=unit_mean)
    want = (clipped + known_noise(0, rows.shape[1], sigma * clip)) / E
    torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-6)
    assert opt.generator.draws == 1
    assert opt.last_unit_norms is not None and len(opt.last_unit_norms) == 5


def test_the_optimizer_steps_with_the_noisy_mean_and_the_noise_is_fresh_each_step(setup):
    """Two logical steps with SGD(lr): Δw = −lr·grad; step 2 adds draw 1 of the key (one draw per step)."""
    state, x, y, rows, clip = setup
    model = mlp()
    model.load_state_dict(state)
    sigma, E, lr = 1.3, 4.0, 0.25
    gsm, opt = dp_optimizer(model, sigma=sigma, clip=clip, expected=E, lr=lr)
    before = torch.cat([p.detach().reshape(-1) for p in opt.params]).double()
    grad = logical_step(gsm, opt, x, y, UNITS, 4)
    after = torch.cat([p.detach().reshape(-1) for p in opt.params]).double()
    torch.testing.assert_close(after, before - lr * grad, rtol=1e-5, atol=1e-6)
    P = rows.shape[1]
    torch.testing.assert_close(grad * E, hand_clipped_sum(rows, UNITS, clip) + known_noise(0, P, sigma * clip),
                               rtol=1e-4, atol=1e-5)  # fmt: skip
    # second step from the moved weights: only the noise is checked (a zero step's grad is noise alone)
    opt.zero_grad(set_to_none=True)
    opt.begin_logical_step(0)
    opt.step()
    noise = torch.cat([p.grad.reshape(-1) for p in opt.params]).double() * E
    torch.testing.assert_close(noise, known_noise(1, P, sigma * clip), rtol=1e-5, atol=1e-6)
    assert opt.generator.draws == 2


def test_an_empty_poisson_batch_still_steps_with_noise_alone():
    """No records: grad = N(0, (σC)² I)/E exactly (draw 0), the weights move, the accountant counts the step."""
    model = mlp()
    sigma, clip, E = 2.0, 0.5, 3.0
    _, opt = dp_optimizer(model, sigma=sigma, clip=clip, expected=E, lr=1.0)
    accountant = dpopt.StepAccountant(sigma, 0.25)
    opt.attach_step_hook(accountant.step)
    before = torch.cat([p.detach().reshape(-1) for p in opt.params]).double()
    opt.begin_logical_step(0)
    opt.step()
    grad = torch.cat([p.grad.reshape(-1) for p in opt.params]).double()
    want = known_noise(0, grad.numel(), sigma * clip) / E
    torch.testing.assert_close(grad, want, rtol=1e-6, atol=1e-7)
    after = torch.cat([p.detach().reshape(-1) for p in opt.params]).double()
    torch.testing.assert_close(after, before - grad, rtol=1e-5, atol=1e-6)
    assert accountant.steps == 1 and opt.generator.draws == 1


def test_noise_std_is_sigma_c_over_e_statistically():
    """Independently of the known-answer checks: 3 000 noise values of an empty step have std σC/E (fixed key;
    the bound, 6 standard errors of the sample std, is ~10 % wide, so σ or E alone (std off ≥ 2×) cannot pass)."""
    model = torch.nn.Linear(60, 50)
    sigma, clip, E = 0.9, 3.0, 2.5
    _, opt = dp_optimizer(model, sigma=sigma, clip=clip, expected=E)
    opt.begin_logical_step(0)
    opt.pre_step()
    grad = torch.cat([p.grad.reshape(-1) for p in opt.params]).double()
    n, sd = grad.numel(), sigma * clip / E
    assert n == 3050
    assert abs(float(grad.std()) / sd - 1) < 6 / math.sqrt(2 * n)
    assert abs(float(grad.mean())) < 6 * sd / math.sqrt(n)


def test_unit_mean_needs_row_weights():
    model = mlp()
    gsm, opt = dp_optimizer(model, sigma=1.0, clip=1.0, expected=2.0, unit_mean=True)
    x, y = data(2)
    opt.begin_logical_step(1)
    F.cross_entropy(gsm(x), y, reduction="sum").backward()
    with pytest.raises(ValueError, match="row_weight"):
        opt.accumulate(torch.tensor([0, 0]))


def test_step_accountant_counts_steps_per_sigma_and_q():
    acc = dpopt.StepAccountant(1.1, 0.02)
    opt = SimpleNamespace(noise_multiplier=1.1)
    for _ in range(3):
        acc.step(opt)
    opt.noise_multiplier = 0.9
    acc.step(opt)
    assert acc.history == [(1.1, 0.02, 3), (0.9, 0.02, 1)] and acc.steps == 4
    assert dpopt.StepAccountant(1.0, 0.1).steps == 0


def test_normalize_gamma_is_a_public_multiple_of_c():
    from dplora.contract.spec import NORMALIZE_GAMMA

    assert dpopt.normalize_gamma(SimpleNamespace(clipping="clip", max_grad_norm=2.0)) is None
    assert dpopt.normalize_gamma(SimpleNamespace(max_grad_norm=2.0)) is None
    assert dpopt.normalize_gamma(SimpleNamespace(clipping="normalize", max_grad_norm=2.0)) == NORMALIZE_GAMMA * 2.0


def plan(**kw):
    base = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "expected_batch_size": 4.0, "sample_rate": 0.1}
    return SimpleNamespace(**{**base, **kw})


def test_make_private_wires_the_plan_an_os_entropy_generator_and_the_accountant(setup):
    """make_private (opacus path): σ, C, E from the plan; a ChaCha20 generator per call; one accountant step per
    logical step; with clipping=normalize each unit becomes C·v/(‖v‖ + γ)."""
    state, x, y, rows, clip = setup
    model = mlp()
    model.load_state_dict(state)
    p = plan(noise_multiplier=0.6, max_grad_norm=clip, expected_batch_size=5.0, clipping="normalize")
    gsm, opt, accountant = dpopt.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.0), plan=p, unit_mean=False, per_sample="opacus"
    )
    assert isinstance(opt.generator, CsprngGaussian) and opt.generator.draws == 0
    assert (opt.noise_multiplier, opt.max_grad_norm, opt.expected_batch_size) == (0.6, clip, 5.0)
    gamma = dpopt.normalize_gamma(p)
    assert opt.accumulator.normalize_gamma == gamma
    logical_step(gsm, opt, x, y, UNITS, 4, apply=False)
    clipped, _ = opt.accumulator.finish()
    want = torch.zeros(rows.shape[1], dtype=torch.float64)
    for u in range(5):
        v = rows[[i for i, x in enumerate(UNITS) if x == u]].sum(0)
        want += clip * v / (float(v.norm()) + gamma)
    torch.testing.assert_close(clipped.double(), want, rtol=1e-4, atol=1e-6)
    assert accountant.steps == 1 and accountant.history == [(0.6, 0.1, 1)]
    _, other, _ = dpopt.make_private(mlp(), torch.optim.SGD(mlp().parameters(), lr=0.0), plan=plan(),
                                     unit_mean=False, per_sample="opacus")  # fmt: skip
    assert not torch.equal(other.generator.normal(16, 1.0), dpopt.os_entropy_generator().normal(16, 1.0))


def test_the_fast_path_gives_the_same_clipped_sum_as_a_brute_force_backward():
    """make_private(per_sample="fast") on a tiny peft LoRA Llama: σ = 0 (a zero generator is still drawn) and the
    grad·E equals Σ_u clip_C(Σ_i g_i) with g_i from one batch-of-one backward per record."""
    model = get_peft_model(
        tiny_llama(layers=1, seed=3), LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, target_modules=["q_proj"])
    )
    randomize_lora_b(model, 4)
    records = [([1, 2, 3, 4], [1, 2, 3, 4]), ([5, 6, 7], [5, 6, 7]), ([8, 9], [8, 9]), ([10, 11, 12], [10, 11, 12])]
    units = [0, 0, 1, 2]
    trainable = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for record in records:
        model.zero_grad(set_to_none=True)
        batching.per_sequence_loss(model, batching.collate([record], 256)).sum().backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in trainable]).double())
    rows = torch.stack(rows)
    model.zero_grad(set_to_none=True)
    E = 2.0
    clip = float(rows[2].norm())  # unit 1 sits at C; the others are compared with it
    fwd, opt, _ = dpopt.make_private(model, torch.optim.SGD(trainable, lr=0.0),
                                     plan=plan(noise_multiplier=0.0, max_grad_norm=clip, expected_batch_size=E),
                                     unit_mean=False, per_sample="fast")  # fmt: skip
    opt.begin_logical_step(3)
    for a, b in ((0, 1), (1, 4)):
        opt.prepare_batch(b - a)
        batching.per_sequence_loss(fwd, batching.collate(records[a:b], 256)).sum().backward()
        opt.accumulate(torch.tensor(units[a:b]), continues=(a, b) == (0, 1))
    opt.pre_step()
    grad = torch.cat([p.grad.reshape(-1) for p in opt.params]).double()
    torch.testing.assert_close(grad * E, hand_clipped_sum(rows, units, clip), rtol=1e-4, atol=1e-6)
    assert opt.generator.draws == 1
