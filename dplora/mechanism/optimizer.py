"""Engine: DP-SGD over protected units on a peft LoRA model, with Opacus per-sample gradients.

One logical step (Abadi et al. 2016, Alg. 1, with units as in Charles et al. 2024, arXiv 2407.07737):
  1. Poisson-sample units with rate q (OS entropy);
  2. forward/backward every record of the sampled units in physical batches; Opacus hooks give each
     record's gradient; :meth:`UnitDPOptimizer.accumulate` sums them into one vector per unit;
  3. clip each unit's vector to C (flat L2 over all trainable LoRA tensors) and sum over units;
  4. add N(0, σ²C²) once, from a ChaCha20 keystream keyed with 256 bits of OS entropy (:mod:`dplora.mechanism.noise`);
  5. divide by the public normalizer (expected units per step), step the optimizer and the accountant.
Empty batches skip 2 and still run 3–5. Only this module (with ``model``) imports torch, peft and opacus.
"""

from __future__ import annotations

import torch
from opacus.optimizers import DPOptimizer

from dplora.contract.choices import PerSamplePath
from dplora.engine.fastclip import FlatLoRAGrads, checkpointing_mode
from dplora.engine.perexample import assign_flat_grads, opacus_flat, opacus_module
from dplora.errors import TrainingFailedError
from dplora.mechanism.clipping import UnitClipAccumulator
from dplora.mechanism.noise import CsprngGaussian, generator_name, privatize


def os_entropy_generator() -> CsprngGaussian:
    """This process's Gaussian noise source: ChaCha20 keyed with 256 bits from ``os.urandom``, never stored.

    Device-agnostic: :meth:`dplora.mechanism.noise.CsprngGaussian.normal` makes the stream on the host and
    transforms it on the output's device (see :mod:`dplora.mechanism.noise`). Replaces a torch ``Generator``
    (mt19937 keeps 32 bits of its seed).
    """
    return CsprngGaussian()


def noise_generator_name(device: torch.device | str) -> str:
    """The Gaussian noise generator in words, for the release record (the same generator on every device)."""
    return generator_name(device)


class UnitDPOptimizer(DPOptimizer):
    """Opacus ``DPOptimizer`` that clips per protected unit, with memory bounded by the physical batch.

    Per-record gradients arrive as one flat buffer G (B, P) per physical batch, from either per-sample path:
    ``fast`` (:class:`dplora.engine.fastclip.FlatLoRAGrads`: each LoRA layer's backward writes its columns) or
    ``opacus`` (Opacus hooks' ``p.grad_sample``, copied by :func:`dplora.engine.perexample.opacus_flat`).
    :meth:`accumulate` folds it into a :class:`dplora.mechanism.clipping.UnitClipAccumulator`, which sums each
    unit's records (contiguous, in unit order), clips the unit to C and keeps one running clipped sum plus at most
    one open unit: nothing scales with the number of units in a logical step. :meth:`pre_step` adds N(0, (σC)² I)
    once (one draw of P values from ``generator``, a :class:`dplora.mechanism.noise.CsprngGaussian`), divides by the
    public ``expected_batch_size`` (expected units per step, never the realised count), writes each tensor's
    ``.grad`` and calls the step hook (the accountant).
    """

    def __init__(
        self,
        optimizer,
        *,
        noise_multiplier,
        max_grad_norm,
        expected_batch_size,
        generator,
        unit_mean=False,
        flat: FlatLoRAGrads | None = None,
        reducer=None,
        normalize_gamma: float | None = None,
    ):
        super().__init__(
            optimizer,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size,
            loss_reduction="sum",
            generator=generator,
        )
        self.unit_mean = unit_mean
        self.flat = flat
        self.reducer = reducer  # a dplora.mechanism.reduction.StepReducer for a multi-process run, else None
        if flat is not None and [id(p) for p in flat.parameters] != [id(p) for p in self.params]:
            raise TrainingFailedError("the optimizer's parameters are not the fast path's LoRA tensors in order")
        device = self.params[0].device if self.params else torch.device("cpu")
        self.num_params = sum(p.numel() for p in self.params)
        self.accumulator = UnitClipAccumulator(
            max(self.num_params, 1), max_grad_norm, device, normalize_gamma=normalize_gamma
        )
        self._rows: torch.Tensor | None = None  # the Opacus path's (B, P) copy buffer, reused
        self.last_unit_norms: torch.Tensor | None = None

    def begin_logical_step(self, num_units: int = 0) -> None:
        """Start a logical step (``num_units`` is informational: no buffer depends on it)."""
        self.accumulator.begin_step()

    def prepare_batch(self, batch_size: int) -> None:
        """Before the forward of a physical batch of B ≥ 1 records: arm the fast path's (B, P) buffer."""
        if self.flat is not None:
            self.flat.buffer(batch_size)

    def discard_batch(self) -> None:
        """After the backward of a padding batch (``training.sharding: fsdp``: a rank with fewer physical batches
        than another runs extra forwards so that FSDP's collectives match): its per-example rows are read and
        dropped, never added to any unit's sum.

        Raises:
            TrainingFailedError: the Opacus path (it has no padding batches; sharding needs the fast path), or a LoRA
                layer that wrote no rows.
        """
        if self.flat is None:
            raise TrainingFailedError("padding batches need the fast per-example path (privacy.per_sample: fast)")
        self.flat.gradients()

    def accumulate(
        self,
        unit_of_row: torch.Tensor,
        *,
        continues: bool = False,
        row_weight: torch.Tensor | None = None,
        finite_rows: torch.Tensor | None = None,
    ) -> None:
        """Fold this physical batch's per-record gradients into the per-unit clipped sum.

        Args:
            unit_of_row: shape (B,), the local unit index of each record; non-decreasing over the logical step
                (a unit's records are contiguous). Read on the host (the sampler's indices; no device sync).
            continues: the batch's last unit has more records in the next physical batch.
            row_weight: shape (B,), each record's weight in its unit's vector (1 / records of the unit for
                ``unit_clipping: mean``); required when ``unit_mean``.
            finite_rows: shape (B,) bool, False for a record whose loss was non-finite: it contributes zero, as
                does a record whose gradient row overflowed (:meth:`UnitClipAccumulator.add`).

        Raises:
            TrainingFailedError: a trainable tensor got no per-sample gradient.
        """
        if self.flat is not None:
            G = self.flat.gradients()
        else:
            rows = len(unit_of_row)
            if self._rows is None or self._rows.shape[0] < rows:
                device = self.params[0].device
                self._rows = None
                self._rows = torch.empty((rows, self.num_params), dtype=torch.float32, device=device)
            G = opacus_flat(self.params, self._rows[:rows], expected_rows=rows)
        if self.unit_mean and row_weight is None:
            raise ValueError("unit_clipping=mean needs row_weight (1 / records of each record's unit)")
        self.accumulator.add(
            G,
            unit_of_row.to("cpu"),
            last_unit_continues=continues,
            row_weight=row_weight if self.unit_mean else None,
            finite_rows=finite_rows,
        )

    def pre_step(self, closure=None) -> bool:
        """Clipped sum (P,) + N(0, (σC)² I) once, divided by the public normalizer → ``.grad``; accountant step.

        With a ``reducer`` (W processes) the clipped sums of all ranks are added by one all-reduce, the noise is
        drawn once on rank 0 only, and every rank divides by the same public normalizer (see dplora.engine.distributed).
        """
        if self.reducer is not None:
            noisy_mean = self.reducer.privatize(
                self.accumulator,
                noise_multiplier=self.noise_multiplier,
                max_grad_norm=self.max_grad_norm,
                expected_batch_size=self.expected_batch_size,
                generator=self.generator,
            )
        else:
            clipped_sum, self.last_unit_norms = self.accumulator.finish()
            noisy_mean = privatize(
                clipped_sum,
                noise_multiplier=self.noise_multiplier,
                max_grad_norm=self.max_grad_norm,
                expected_batch_size=self.expected_batch_size,
                generator=self.generator,
            )
        assign_flat_grads(self.params, noisy_mean)
        if self.step_hook:
            self.step_hook(self)
        return True


class StepAccountant:
    """Counts logical steps as an Opacus-style history [(σ, q, steps)]; ε is read from the plan's curve."""

    def __init__(self, noise_multiplier: float, sample_rate: float):
        self.noise_multiplier, self.sample_rate = noise_multiplier, sample_rate
        self.history: list[tuple[float, float, int]] = []

    @property
    def steps(self) -> int:
        """Logical steps accounted so far (T done)."""
        return sum(s for _, _, s in self.history)

    def step(self, optimizer: DPOptimizer) -> None:
        """Record one logical step at (σ, q): called from the optimizer's step hook, empty batches included."""
        if self.history and self.history[-1][:2] == (optimizer.noise_multiplier, self.sample_rate):
            sigma, q, n = self.history[-1]
            self.history[-1] = (sigma, q, n + 1)
        else:
            self.history.append((optimizer.noise_multiplier, self.sample_rate, 1))


def normalize_gamma(plan) -> float | None:
    """γ = NORMALIZE_GAMMA·C for a plan with ``clipping == "normalize"`` (public: from the contract), else None."""
    from dplora.contract.spec import NORMALIZE_GAMMA

    if getattr(plan, "clipping", "clip") != "normalize":
        return None
    return NORMALIZE_GAMMA * plan.max_grad_norm


def make_private(model: torch.nn.Module, optimizer, *, plan, unit_mean: bool, per_sample: str = "opacus", reducer=None):
    """Wrap a peft model and its optimizer: (model to forward, UnitDPOptimizer, StepAccountant).

    Args:
        model: the peft model in train mode, on its device; LoRA tensors fp32.
        optimizer: a torch optimizer over exactly the trainable tensors, in ``named_parameters`` order.
        plan: anything with noise_multiplier σ, max_grad_norm C, expected_batch_size (units), sample_rate q
            (and ``clipping``: ``normalize`` scales each unit to C·v/(‖v‖ + γ), :func:`normalize_gamma`).
        unit_mean: a unit's vector is the mean of its records' gradients (else the sum).
        per_sample: ``fast`` (:class:`dplora.engine.fastclip.FlatLoRAGrads`; the model is returned as is) or
            ``opacus`` (Opacus ``GradSampleModule`` hooks; the wrapper is returned).
        reducer: a :class:`dplora.mechanism.reduction.StepReducer` for a multi-process run (None: one process).

    Raises:
        TrainingFailedError: gradient checkpointing on the ``opacus`` path (it re-fires hooks and breaks per-sample
            gradients), reentrant checkpointing on ``fast``, or a trainable module holds buffers (Opacus refuses
            it; the error names the module and its class).
        UncoveredParameterError: ``fast`` and a trainable tensor that is not a vanilla LoRA A/B weight.
    """
    flat = None
    if PerSamplePath(per_sample) is PerSamplePath.OPACUS and checkpointing_mode(model) != "off":
        raise TrainingFailedError("gradient checkpointing re-fires Opacus hooks: use privacy.per_sample: fast")
    if PerSamplePath(per_sample) is PerSamplePath.FAST:
        flat = FlatLoRAGrads(model)
        wrapped = model
    else:
        wrapped = opacus_module(model)
    dp_opt = UnitDPOptimizer(
        optimizer,
        noise_multiplier=plan.noise_multiplier,
        max_grad_norm=plan.max_grad_norm,
        expected_batch_size=plan.expected_batch_size,
        generator=os_entropy_generator(),
        unit_mean=unit_mean,
        flat=flat,
        reducer=reducer,
        normalize_gamma=normalize_gamma(plan),
    )
    accountant = StepAccountant(plan.noise_multiplier, plan.sample_rate)
    dp_opt.attach_step_hook(accountant.step)
    return wrapped, dp_opt, accountant
