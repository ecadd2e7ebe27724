"""DP-AdamBC (dplora.mechanism.adambc): the update against a float64 hand-written reference of Algorithm 1, Adam at
Φ = 0, the mechanism's Φ against the noise the optimizer really receives, checkpoint state and the contract key."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from dplora.mechanism import optimizer as dpopt
from dplora.mechanism.adambc import DPAdamBC
from dplora.mechanism.core import noise_variance


def _reference(theta, grads, *, lr, phi, betas, gamma, decay):
    """Algorithm 1 of Tang, Shpilevskiy and Lécuyer (AAAI 2024) in float64 Python lists, one coordinate at a time."""
    b1, b2 = betas
    theta = [float(x) for x in theta]
    m = [0.0] * len(theta)
    v = [0.0] * len(theta)
    for t, g in enumerate(grads, start=1):
        for i, gi in enumerate(g):
            m[i] = b1 * m[i] + (1 - b1) * gi
            v[i] = b2 * v[i] + (1 - b2) * gi * gi
            m_hat, v_hat = m[i] / (1 - b1**t), v[i] / (1 - b2**t)
            theta[i] *= 1 - lr * decay
            theta[i] -= lr * m_hat / math.sqrt(max(v_hat - phi, gamma))
    return theta


@pytest.mark.parametrize("phi,decay", [(0.0, 0.0), (0.04, 0.0), (0.3, 0.1), (5.0, 0.0)])
def test_update_equals_algorithm_1(phi, decay):
    """Five steps on 40 coordinates, some with v̂ − Φ below γ (pure-noise-like), equal the reference to 1e-12."""
    gen = torch.Generator().manual_seed(3)
    theta0 = torch.randn(40, generator=gen, dtype=torch.float64)
    grads = [torch.randn(40, generator=gen, dtype=torch.float64) * s for s in (0.1, 1.0, 2.0, 0.5, 3.0)]
    p = torch.nn.Parameter(theta0.clone())
    opt = DPAdamBC([p], lr=0.01, noise_variance=phi, betas=(0.9, 0.99), gamma=1e-4, weight_decay=decay)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    want = _reference(theta0, [g.tolist() for g in grads], lr=0.01, phi=phi, betas=(0.9, 0.99), gamma=1e-4, decay=decay)
    assert torch.allclose(p.detach(), torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)
    if phi >= 5.0:  # every coordinate clamped at γ: the step is m̂/√γ
        assert opt.state[p]["step"] == 5


def test_without_noise_it_is_adam_where_the_second_moment_is_above_gamma():
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(30, generator=gen, dtype=torch.float64)
    grads = [torch.randn(30, generator=gen, dtype=torch.float64) + 2.0 for _ in range(4)]  # v̂ ≥ ~1 ≫ γ
    a, b = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    bc, adam = DPAdamBC([a], lr=0.05, noise_variance=0.0), torch.optim.Adam([b], lr=0.05, eps=0.0)
    for g in grads:
        a.grad, b.grad = g.clone(), g.clone()
        bc.step()
        adam.step()
    assert torch.allclose(a.detach(), b.detach(), rtol=0, atol=1e-12)


def test_the_mechanisms_phi_is_the_variance_of_the_noise_the_optimizer_receives():
    """An empty logical step through make_private: the gradient DP-AdamBC sees is pure noise, and its mean square
    over 90,000 coordinates is Φ = (σC/E)² within 4 standard errors; Φ reads the planned E, not a batch count."""
    sigma, clip, expected = 1.3, 0.5, 7.0
    lin = torch.nn.Linear(300, 300, bias=False)
    plan = SimpleNamespace(noise_multiplier=sigma, max_grad_norm=clip, expected_batch_size=expected, sample_rate=0.1)
    phi = noise_variance(plan)
    assert phi == pytest.approx((sigma * clip / expected) ** 2, rel=1e-15)
    inner = DPAdamBC(lin.parameters(), lr=1e-3, noise_variance=phi)
    seen = []
    original = inner.step

    def spy(closure=None):
        seen.append(lin.weight.grad.detach().reshape(-1).double().clone())
        return original(closure)

    inner.step = spy
    _, dp_opt, accountant = dpopt.make_private(lin, inner, plan=plan, unit_mean=False)
    dp_opt.begin_logical_step(0)
    dp_opt.step()
    (grad,) = seen
    n = grad.numel()
    ratio = float((grad**2).mean()) / phi  # E[g²] = Φ; Var(g²) = 2Φ²
    assert abs(ratio - 1) < 4 * math.sqrt(2 / n)
    assert accountant.steps == 1 and dp_opt.generator.draws == 1


def test_the_control_has_no_noise_variance_and_a_private_mechanism_its_plans():
    from dplora.mechanism.core import DPMechanism

    plan = SimpleNamespace(noise_multiplier=0.9, max_grad_norm=0.1, expected_batch_size=32, sample_rate=0.02)
    control = SimpleNamespace(private=False, plan=plan)
    private = SimpleNamespace(private=True, plan=plan)
    assert DPMechanism.noise_variance.fget(control) == 0.0
    assert DPMechanism.noise_variance.fget(private) == pytest.approx((0.9 * 0.1 / 32) ** 2, rel=1e-15)


@pytest.mark.parametrize(
    "bad",
    [{"lr": 0.0}, {"noise_variance": -1.0}, {"noise_variance": math.inf}, {"betas": (1.0, 0.9)}, {"gamma": 0.0}],
)
def test_bad_settings_are_refused(bad):
    kwargs = {"lr": 0.1, "noise_variance": 0.0, **bad}
    with pytest.raises(ValueError):
        DPAdamBC([torch.nn.Parameter(torch.zeros(2))], **kwargs)
    with pytest.raises(ValueError):
        noise_variance(SimpleNamespace(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=0))


def test_state_survives_a_checkpoint_round_trip():
    """state_dict → load_state_dict (as dplora.run.checkpoint saves tensors and scalars) continues the same run."""
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(8, generator=gen) for _ in range(4)]
    a = torch.nn.Parameter(torch.ones(8))
    opt = DPAdamBC([a], lr=0.1, noise_variance=0.2)
    for g in grads[:2]:
        a.grad = g.clone()
        opt.step()
    saved = copy.deepcopy(opt.state_dict())  # the checkpoint copies every tensor to the host
    b = torch.nn.Parameter(a.detach().clone())
    again = DPAdamBC([b], lr=0.1, noise_variance=0.2)
    again.load_state_dict(saved)
    for g in grads[2:]:
        a.grad, b.grad = g.clone(), g.clone()
        opt.step()
        again.step()
    assert torch.equal(a, b) and again.state[b]["step"] == 4


def test_the_contract_key_builds_dp_adambc_with_the_mechanisms_phi(tmp_path):
    from conftest import contract_dict

    from dplora.contract.loader import parse_contract
    from dplora.mechanism.adambc import make_optimizer

    raw = contract_dict(tmp_path / "m", tmp_path / "d.csv", tmp_path / "o", training={"optimizer": "dp_adambc"})
    training = parse_contract(raw).training
    params = [torch.nn.Parameter(torch.zeros(3))]
    opt = make_optimizer(training, params, noise_variance=0.25)
    assert isinstance(opt, DPAdamBC) and opt.param_groups[0]["noise_variance"] == 0.25
    assert opt.param_groups[0]["lr"] == training.lr and opt.param_groups[0]["weight_decay"] == training.weight_decay
    adamw = training.model_copy(update={"optimizer": type(training.optimizer)("adamw")})
    assert type(make_optimizer(adamw, params, noise_variance=0.25)) is torch.optim.AdamW
