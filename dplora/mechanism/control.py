"""The non-private control run (``privacy.enabled: false``): the same run without clipping or noise.

A control trains the same contract with the same data, model, LoRA, steps T, learning rate, Poisson sampling
of protected units (rate q) and physical batching as its DP twin, so that the held-out loss of the two
measures what privacy cost. Only the step differs: :class:`NonPrivateStep` has the interface of
:class:`dplora.mechanism.optimizer.UnitDPOptimizer` (``begin_logical_step`` / ``prepare_batch`` / ``accumulate`` /
``step``) but sums the records' gradients with no per-unit clip and no noise, then divides by the same public
normaliser (expected units per step). No accountant runs; :class:`StepCounter` only counts steps, so the
"every planned step was taken" check still holds.

A control carries **no DP guarantee** (ε = ∞). It never writes a DP release record: its record uses its own
predicate type (:data:`dplora.release.envelope.NON_PRIVATE_PREDICATE_TYPE`), which ``dplora verify`` reports as NOT
DIFFERENTIALLY PRIVATE (exit 6) and which an older verifier refuses outright; in the budget ledger it is a
charge of ε = ∞ on its population.
"""

from __future__ import annotations

from dplora.plan.training import TrainingPlan

NOT_DP = "NOT DIFFERENTIALLY PRIVATE"
NO_DP_STATEMENT = (
    f"{NOT_DP}: privacy.enabled=false trained without clipping or noise; these adapters carry no DP guarantee "
    "(ε = ∞) and may reveal their training records"
)
ADAPTER_CONFIG_KEY = "dplora_privacy"  # written into adapter_config.json of a control (peft ignores it)


class StepCounter:
    """Counts logical steps, standing in for the accountant of a DP run; computes no ε.

    ``history`` has the accountant's form [(σ, q, steps)] with σ = 0 (no noise), so resume checkpoints
    (:mod:`dplora.run.checkpoint`) save and restore a control's step count like a DP run's.
    """

    def __init__(self, sample_rate: float = 0.0) -> None:
        self.sample_rate = sample_rate
        self.history: list[tuple[float, float, int]] = []

    @property
    def steps(self) -> int:
        """Logical steps taken."""
        return sum(n for _, _, n in self.history)

    def step(self) -> None:
        """Count one logical step."""
        if self.history:
            sigma, q, n = self.history[-1]
            self.history[-1] = (sigma, q, n + 1)
        else:
            self.history.append((0.0, self.sample_rate, 1))


class NonPrivateStep:
    """Plain mini-batch step with the interface of ``UnitDPOptimizer``: no clipping, no noise.

    Each physical batch's ``losses.sum().backward()`` adds its records' gradients into ``p.grad``, so after
    the last physical batch ``p.grad`` is the sum of every sampled record's gradient (shape ``p.shape``, fp32).
    :meth:`step` divides it by the public ``expected_batch_size`` (the DP run's normaliser) and steps the
    optimizer; an empty Poisson batch steps with a zero gradient, as the DP run steps with noise alone.

    Args:
        optimizer: the torch optimizer over the trainable LoRA tensors.
        expected_batch_size: expected protected units per logical step (the public normaliser).
        counter: the :class:`StepCounter` of the run.
    """

    def __init__(self, optimizer, *, expected_batch_size: int, counter: StepCounter):
        self.optimizer = self.original_optimizer = optimizer  # original_optimizer: as Opacus names it (checkpoints)
        self.expected_batch_size = expected_batch_size
        self.counter = counter
        self.params = [p for group in optimizer.param_groups for p in group["params"]]

    def begin_logical_step(self, num_units: int) -> None:
        """Start a logical step of ``num_units`` sampled units: clear the summed gradients."""
        self.optimizer.zero_grad(set_to_none=True)

    def prepare_batch(self, batch_size: int) -> None:
        """Nothing to arm: no per-example buffer."""

    def accumulate(self, unit_of_row, *, continues: bool = False, row_weight=None, finite_rows=None) -> None:
        """Nothing to do: ``backward`` already summed this physical batch's gradients into ``p.grad``.

        ``row_weight`` (``unit_clipping: mean``) is not applied: the control sums its records' gradients. A record
        with a non-finite loss is left out of the backward by the loop (``finite_rows``); one whose gradient
        overflows anyway makes the summed gradient non-finite, and the control stops (no per-record rows here).
        """

    def step(self) -> None:
        """Divide the summed gradient by the public normaliser, step the optimizer, count the step."""
        import torch

        for p in self.params:
            p.grad = torch.zeros_like(p) if p.grad is None else p.grad / self.expected_batch_size
        self.optimizer.step()
        self.counter.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients."""
        self.optimizer.zero_grad(set_to_none=set_to_none)


def make_non_private(model, optimizer, *, plan: TrainingPlan):
    """The control's engine parts: (the plain peft model, :class:`NonPrivateStep`, :class:`StepCounter`).

    No Opacus wrapper: gradients come from one ordinary backward per physical batch.
    """
    counter = StepCounter(plan.sample_rate)
    return model, NonPrivateStep(optimizer, expected_batch_size=plan.expected_batch_size, counter=counter), counter
