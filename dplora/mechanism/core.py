"""The DP mechanism of one run as one frozen object, made by one function.

:func:`make_mechanism` takes the plan (public: q, σ, C, T, the normaliser, clipping), a frozen set of
:class:`PerformanceFlags` (how the per-example rows are computed, never what the mechanism is) and the process group,
and returns a :class:`DPMechanism`. The non-private control comes from the same call with ``private=False``: the
same sampler, steps and normaliser, no clipping and no noise, and a non-private event in place of the DP-SGD one, so
callers ask ``mechanism.private`` instead of re-reading the contract. The loop, the record, the ledger and the
checkpoint read ``mechanism.event``.

Modelled on jax_privacy's ``DPExecutionPlan`` (a frozen plan; ``PerformanceFlags`` apart; ``NonPrivateConfig.make()``
returning the same type with a non-private event).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from dplora.accounting.events import DpSgdEvent
from dplora.mechanism.control import make_non_private
from dplora.mechanism.flags import PerformanceFlags
from dplora.mechanism.reduction import step_reducer
from dplora.mechanism.sampling import unit_sampler
from dplora.plan.training import control_plan

if TYPE_CHECKING:
    from dplora.engine.distributed import World
    from dplora.plan.training import TrainingPlan


@dataclasses.dataclass(frozen=True, kw_only=True)
class NonPrivateEvent:
    """The event of a non-private control: no DP guarantee (ε = ∞); dp_accounting's ``NonPrivateDpEvent``."""

    steps: int

    def to_dict(self) -> dict:
        """JSON-ready description (a control's record and ledger charge say ε = ∞)."""
        return {"mechanism": "none", "event": "NonPrivate", "steps": self.steps}

    def to_dp_accounting(self):
        """``dp_accounting.NonPrivateDpEvent()`` (imports dp_accounting lazily)."""
        import dp_accounting

        return dp_accounting.NonPrivateDpEvent()


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPMechanism:
    """One run's mechanism: Poisson sampling at q over N units, per-unit clip to C (or normalize), one draw of
    N(0, σ²C²) per logical step, the public normaliser E = q·N, T steps, on ``world``'s processes.

    Attributes:
        private: False for the non-private control (no clip, no noise, no accountant; ε = ∞).
        event: the accounted event (:class:`dplora.accounting.events.DpSgdEvent`, T = planned steps), or a
            :class:`NonPrivateEvent` for the control.
        plan: the plan the mechanism was made from (the control's: :func:`dplora.plan.training.control_plan`).
        unit_mean: a unit's vector is the mean of its records' gradients (else the sum); public, from the contract.
        flags: how the rows are computed.
        world: the run's processes.
    """

    private: bool
    event: DpSgdEvent | NonPrivateEvent
    plan: TrainingPlan
    unit_mean: bool
    flags: PerformanceFlags
    world: World

    @property
    def noise_variance(self) -> float:
        """Φ = (σC/E)², the per-coordinate variance of the noise in the gradient the torch optimizer receives
        (gradient units squared; :func:`noise_variance` of the plan), 0 for the control. DP-AdamBC reads it."""
        return noise_variance(self.plan) if self.private else 0.0

    def sampler(self, num_units: int):
        """The run's Poisson sampler over ``num_units`` units at q (this rank's shard under W > 1); fresh OS
        entropy. Raises: ValueError for q outside (0, 1]."""
        return unit_sampler(num_units, self.plan.sample_rate, self.world)

    def reducer(self, num_params: int, device):
        """The cross-rank reduction for P = ``num_params`` LoRA values, or None in one process (or a control)."""
        return step_reducer(self.world, num_params, device) if self.private else None

    def wrap(self, model, optimizer, *, reducer=None):
        """(model to forward, step optimizer, accountant) for ``model`` and its optimizer over the trainable LoRA
        tensors: the DP optimizer over units (:func:`dplora.mechanism.optimizer.make_private`) or, for the
        control, :func:`dplora.mechanism.control.make_non_private`.

        Raises:
            TrainingFailedError, UncoveredParameterError: as :func:`dplora.mechanism.optimizer.make_private`.
        """
        if not self.private:
            return make_non_private(model, optimizer, plan=self.plan)
        from dplora.mechanism.optimizer import make_private  # torch and opacus: only when a model is wrapped

        return make_private(
            model,
            optimizer,
            plan=self.plan,
            unit_mean=self.unit_mean,
            per_sample=self.flags.per_sample.value,
            reducer=reducer,
        )


def noise_variance(plan) -> float:
    """Φ = (σC/E)², the per-coordinate variance of the noise in the gradient the torch optimizer receives.

    Args:
        plan: anything with ``noise_multiplier`` σ, ``max_grad_norm`` C and ``expected_batch_size`` E (units).
    Returns:
        Φ ≥ 0 (gradient units squared); 0 for σ = 0 (the non-private control).
    Raises:
        ValueError: E ≤ 0, or σ or C negative or not finite.
    """
    sigma, clip, expected = float(plan.noise_multiplier), float(plan.max_grad_norm), float(plan.expected_batch_size)
    if not (0 < expected < math.inf and 0 <= sigma < math.inf and 0 <= clip < math.inf):
        raise ValueError(f"noise variance needs σ ≥ 0, C ≥ 0 and E > 0, got σ={sigma}, C={clip}, E={expected}")
    return (sigma * clip / expected) ** 2


def make_mechanism(
    plan: TrainingPlan, flags: PerformanceFlags, world: World, *, private: bool = True, unit_mean: bool = False
) -> DPMechanism:
    """The run's :class:`DPMechanism` from its plan, performance flags and process group.

    Args:
        plan: the calibrated plan (q, σ, C, T, E, clipping), public.
        flags: the per-example path.
        world: the run's processes (:data:`dplora.engine.distributed.SINGLE` in one process).
        private: False makes the non-private control from the same plan (σ = 0, ε = ∞, same q, T and E).
        unit_mean: ``privacy.unit_clipping: mean`` (a unit's vector is its records' mean gradient).
    Returns:
        The frozen mechanism.
    Raises:
        ValueError: ``private`` with σ ≤ 0, or the plan's q, σ or T cannot make a DP-SGD event (the plan refuses
            these earlier).
    Source: Abadi et al. 2016, Alg. 1; units as in Charles et al. 2024 (arXiv 2407.07737).
    """
    if not private:
        plan = control_plan(plan)
        event = NonPrivateEvent(steps=plan.steps)
    elif not plan.noise_multiplier > 0:  # a private mechanism adds noise: σ = 0 is the control, never DP
        raise ValueError(f"a DP mechanism needs noise_multiplier > 0, got {plan.noise_multiplier!r}")
    else:
        event = DpSgdEvent(
            sample_rate=plan.sample_rate,
            noise_multiplier=plan.noise_multiplier,
            steps=plan.steps,
            adjacency=plan.adjacency,
        )
    return DPMechanism(private=private, event=event, plan=plan, unit_mean=unit_mean, flags=flags, world=world)
