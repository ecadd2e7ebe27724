"""Engine: DP-SGD over protected units on a peft LoRA model, with Opacus per-sample gradients.

One logical step (Abadi et al. 2016, Alg. 1, with units as in Charles et al. 2024, arXiv 2407.07737):
  1. Poisson-sample units with rate q (OS entropy);
  2. forward/backward every record of the sampled units in physical batches; Opacus hooks give each
     record's gradient; :meth:`UnitDPOptimizer.accumulate` sums them into one vector per unit;
  3. clip each unit's vector to C (flat L2 over all trainable LoRA tensors) and sum over units;
  4. add N(0, σ²C²) once, from a ChaCha20 keystream keyed with 256 bits of OS entropy (:mod:`dplora.engine.noise`);
  5. divide by the public normalizer (expected units per step), step the optimizer and the accountant.
Empty batches skip 2 and still run 3–5. Only this module (with ``model``) imports torch, peft and opacus.
"""

from __future__ import annotations

import enum
import os

import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer

from dplora.engine.batch import IGNORE_INDEX, collate, per_sequence_loss  # noqa: F401 - re-exported
from dplora.engine.clipping import UnitClipAccumulator, assign_flat_grads, opacus_flat, privatize
from dplora.engine.fastclip import FlatLoRAGrads, checkpointing_mode
from dplora.engine.noise import CsprngGaussian, generator_name
from dplora.errors import TrainingFailedError


def os_entropy_generator() -> CsprngGaussian:
    """This process's Gaussian noise source: ChaCha20 keyed with 256 bits from ``os.urandom``, never stored.

    Device-agnostic: :meth:`dplora.engine.noise.CsprngGaussian.normal` makes the stream on the host and transforms it on
    the output's device (see :mod:`dplora.engine.noise`). Replaces a torch ``Generator`` (mt19937 keeps 32 bits of its
    seed).
    """
    return CsprngGaussian()


def _busy_cores(interval_s: float = 0.3) -> float | None:
    """Cores busy with other work right now, from two /proc/stat samples (Linux); None elsewhere."""
    import time

    def sample():
        with open("/proc/stat") as fh:
            fields = [float(x) for x in fh.readline().split()[1:]]
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # total, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(interval_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (1.0 - (idle1 - idle0) / (total1 - total0)) * (os.cpu_count() or 1)


def free_threads() -> int:
    """CPU threads to use: the cores available to this process minus those busy with other work, at least 1.

    Busy cores are measured over 0.3 s from /proc/stat (the 1-minute load average lags behind and would
    count work that has just finished); elsewhere the load average is used.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = _busy_cores()
    if busy is None:
        busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, cores - int(busy + 0.5))


def parameter_device(model: torch.nn.Module) -> torch.device:
    """The device of the first trainable parameter (every tensor the engine creates goes there)."""
    return next((p.device for p in model.parameters() if p.requires_grad), torch.device("cpu"))


def noise_generator_name(device: torch.device | str) -> str:
    """The Gaussian noise generator in words, for the release record (the same generator on every device)."""
    return generator_name(device)


class UnitDPOptimizer(DPOptimizer):
    """Opacus ``DPOptimizer`` that clips per protected unit, with memory bounded by the physical batch.

    Per-record gradients arrive as one flat buffer G (B, P) per physical batch, from either per-sample path:
    ``fast`` (:class:`dplora.engine.fastclip.FlatLoRAGrads`: each LoRA layer's backward writes its columns) or
    ``opacus``
    (Opacus hooks' ``p.grad_sample``, copied by :func:`dplora.engine.clipping.opacus_flat`). :meth:`accumulate` folds it
    into a :class:`dplora.engine.clipping.UnitClipAccumulator`, which sums each unit's records (contiguous, in unit
    order), clips the unit to C and keeps one running clipped sum plus at most one open unit: nothing scales with
    the number of units in a logical step. :meth:`pre_step` adds N(0, (σC)² I) once (one draw of P values from
    ``generator``, a :class:`dplora.engine.noise.CsprngGaussian`), divides by the public ``expected_batch_size``
    (expected units per step, never the realised count), writes each tensor's ``.grad`` and calls the step hook
    (the accountant).
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
        self.reducer = reducer  # a dplora.engine.distributed.StepReducer for a multi-process run, else None
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


class PerSample(str, enum.Enum):
    """Where per-record gradients come from: dplora's fast LoRA path, or Opacus hooks (the reference)."""

    FAST = "fast"
    OPACUS = "opacus"


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
        reducer: a :class:`dplora.engine.distributed.StepReducer` for a multi-process run (None: one process).

    Raises:
        TrainingFailedError: gradient checkpointing on the ``opacus`` path (it re-fires hooks and breaks per-sample
            gradients), reentrant checkpointing on ``fast``, or a trainable module holds buffers (Opacus refuses
            it; the error names the module and its class).
        UncoveredParameterError: ``fast`` and a trainable tensor that is not a vanilla LoRA A/B weight.
    """
    flat = None
    if PerSample(per_sample) is PerSample.OPACUS and checkpointing_mode(model) != "off":
        raise TrainingFailedError("gradient checkpointing re-fires Opacus hooks: use privacy.per_sample: fast")
    if PerSample(per_sample) is PerSample.FAST:
        flat = FlatLoRAGrads(model)
        wrapped = model
    else:
        wrapped = _opacus_module(model)
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


def _opacus_module(model: torch.nn.Module) -> GradSampleModule:
    try:
        return GradSampleModule(model, batch_first=True, loss_reduction="sum")
    except NotImplementedError:  # Opacus refuses a trainable module that holds buffers (cases T6): name it
        bad = [
            f"{name or 'model'} ({type(m).__name__})"
            for name, m in model.named_modules()
            if any(p.requires_grad for p in m.parameters(recurse=False)) and any(True for _ in m.buffers())
        ]
        raise TrainingFailedError(
            f"Opacus cannot compute per-sample gradients for trainable module {', '.join(bad) or '?'}: "
            "it holds buffers; freeze its parameters"
        ) from None


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The peft model inside an Opacus wrapper (or the model itself on the fast path)."""
    return model._module if isinstance(model, GradSampleModule) else model


def probe_per_sample_gradients(
    model: torch.nn.Module, named_trainable: list[tuple[str, torch.nn.Parameter]], dp_opt=None
) -> list[dict]:
    """Before step 1, on synthetic batches (no private data): every trainable tensor gets a per-sample gradient,
    and (with ``dp_opt``) the active path's per-example rows equal a one-record-at-a-time backward.

    The batch is built on the parameters' device. With the fast path (``dp_opt.flat``) the first check is that every
    LoRA layer wrote its slice of G; with Opacus, that every tensor got ``grad_sample``. The second is
    :func:`dplora.engine.gradcheck.check_per_example_gradients` (a batch with padded length ≠ batch size and one with
    padded length = batch size, both with repeated tokens, and one with no token twice; dropout masks held fixed;
    the model restored exactly; no noise, no accountant step).

    Returns:
        The comparison's report per synthetic batch (records, padded tokens, largest relative difference, rtol);
        [] without ``dp_opt``.

    Raises:
        TrainingFailedError: naming the first tensor that got none (cases T2), or the first layer and tensor whose
            per-example gradient differs from the one-record backward (issue 22).
    """
    from dplora.engine.gradcheck import check_per_example_gradients

    device = next((p.device for _, p in named_trainable), torch.device("cpu"))
    batch = collate([([1, 2, 3, 4], [1, 2, 3, 4]), ([5, 6, 7], [5, 6, 7])], pad_id=0, device=device)
    flat = getattr(dp_opt, "flat", None)
    if flat is not None:
        flat.buffer(2)
    per_sequence_loss(model, batch).sum().backward()
    if flat is not None:
        flat.gradients()  # raises naming the first LoRA tensor whose slice was not written
        missing = []
    else:
        missing = [n for n, p in named_trainable if getattr(p, "grad_sample", None) is None]
    for _, p in named_trainable:
        p.grad_sample = None
        p.grad = None
    if missing:
        raise TrainingFailedError(f"trainable parameter {missing[0]} gets no per-sample gradient; freeze or remove it")
    if dp_opt is None:
        return []
    return check_per_example_gradients(model, named_trainable, dp_opt, loss=per_sequence_loss, collate=collate)


def check_all_moved(before: dict[str, torch.Tensor], named_trainable) -> None:
    """Abort naming the first trainable LoRA tensor that did not change (max |Δ| == 0; cases T1).

    Raises:
        TrainingFailedError: a tensor did not move.
    """
    for name, p in named_trainable:
        if float((p.detach() - before[name]).abs().max()) == 0.0:
            raise TrainingFailedError(f"trainable tensor {name} did not change after the first step")
