"""DP-AdamBC: Adam whose second moment is corrected for the known variance of the DP noise.

The torch optimizer of a DP run sees, per coordinate, ``g̃ = (Σ clipped + N(0, σ²C²)) / E``: the clipped mean plus
Gaussian noise of known variance ``Φ = (σC/E)²`` (σ the noise multiplier, C the clipping norm, E the public
normaliser, expected units per step; :class:`dplora.mechanism.core.DPMechanism`). Adam's second moment estimates
``E[g̃²] = E[g]² + Var(g) + Φ``; with σC/E large it is dominated by Φ, so Adam's step ``m̂/√v̂`` becomes a constant
rescaling, i.e. DP-SGD. DP-AdamBC subtracts Φ from the bias-corrected second moment before the square root:

    m_t = β₁ m + (1 − β₁) g̃,   v_t = β₂ v + (1 − β₂) g̃²,   m̂ = m_t / (1 − β₁ᵗ),   v̂ = v_t / (1 − β₂ᵗ)
    θ ← θ − lr · (m̂ / √max(v̂ − Φ, γ) + λ θ)        (λ: decoupled weight decay, as AdamW)

γ > 0 keeps the denominator away from zero where the corrected moment is ≤ 0 (pure-noise coordinates).

It reads only the noised gradient and public numbers (σ, C, E are in the plan), so it is post-processing of the
DP output: no privacy effect. Φ uses the **planned** normaliser E, never a realised batch size (a private count).

Source: Q. Tang, F. Shpilevskiy and M. Lécuyer, "DP-AdamBC: Your DP-Adam Is Actually DP-SGD (Unless You Apply
Bias Correction)", AAAI 2024 (arXiv 2312.14334), Algorithm 1.
"""

from __future__ import annotations

import torch

from dplora.engine.specs import OptimizerSpec

DEFAULT_GAMMA = 1e-8  # γ, the floor under the corrected second moment (the paper's ε' of Algorithm 1; tunable)


class DPAdamBC(torch.optim.Optimizer):
    """Adam with the DP noise variance removed from its second moment (see the module docstring).

    Args:
        params: the trainable LoRA tensors (or parameter groups).
        lr: learning rate (> 0).
        noise_variance: Φ = (σC/E)² (:attr:`dplora.mechanism.core.DPMechanism.noise_variance`), ≥ 0; 0 gives
            Adam with ``√max(v̂, γ)`` in the denominator.
        betas: (β₁, β₂), each in [0, 1).
        gamma: γ > 0, the floor under ``v̂ − Φ``.
        weight_decay: decoupled weight decay λ ≥ 0 (AdamW's form).
    Raises:
        ValueError: a value out of its range.
    Source: Tang, Shpilevskiy and Lécuyer, AAAI 2024 (arXiv 2312.14334), Algorithm 1.
    """

    def __init__(
        self,
        params,
        *,
        lr: float,
        noise_variance: float,
        betas: tuple[float, float] = (0.9, 0.999),
        gamma: float = DEFAULT_GAMMA,
        weight_decay: float = 0.0,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not (0 <= noise_variance < float("inf")):
            raise ValueError(f"noise_variance must be finite and ≥ 0, got {noise_variance}")
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        if not gamma > 0:
            raise ValueError(f"gamma must be > 0, got {gamma}")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be ≥ 0, got {weight_decay}")
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "gamma": gamma,
            "weight_decay": weight_decay,
            "noise_variance": float(noise_variance),
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter with a gradient (see the module docstring); returns ``closure()``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, gamma, decay, phi = group["lr"], group["gamma"], group["weight_decay"], group["noise_variance"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat = m / (1 - beta1**t)
                denom = (v / (1 - beta2**t) - phi).clamp_(min=gamma).sqrt_()
                if decay:
                    p.mul_(1 - lr * decay)
                p.addcdiv_(m_hat, denom, value=-lr)
        return loss


def make_optimizer(training: OptimizerSpec, params, *, noise_variance: float = 0.0):
    """``training.optimizer`` (SGD, Adam, AdamW or DP-AdamBC) over ``params`` at ``training.lr`` and
    ``weight_decay``; DP-AdamBC subtracts ``noise_variance`` Φ = (σC/E)² (the mechanism's) from its second moment.

    Raises:
        ValueError: a negative or non-finite ``noise_variance`` (DP-AdamBC).
    """
    import torch

    lr, wd = training.lr, training.weight_decay
    name = training.optimizer.value
    if name == "dp_adambc":
        return DPAdamBC(params, lr=lr, noise_variance=noise_variance, weight_decay=wd)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=wd)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    return torch.optim.AdamW(params, lr=lr, weight_decay=wd)
