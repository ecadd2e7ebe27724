"""The physical batch: records per forward/backward. Memory only, never a privacy setting.

``training.physical_batch_size: auto`` is resolved before step 1 by :func:`probe_physical_batch`, on SYNTHETIC
batches of ``max_seq_len`` tokens (never private records), so the value recorded under ``execution`` depends only on
the model, the device and public contract keys. On CUDA it tries a batch and halves it on ``torch.OutOfMemoryError``
(the try-and-back-off of Hugging Face accelerate's ``find_executable_batch_size``); on CPU it is
:data:`CPU_DEFAULT`. A probe runs forward and backward only: no optimizer step, no noise, no accountant step.

If a logical step still runs out of memory, :func:`dplora.run.loop.logical_step` calls :func:`reset_after_oom` and
re-runs the SAME sampled units with half the physical batch: the Poisson sample is drawn once per logical step, the
clipped per-unit sum is rebuilt from zero, and the noise and the accountant step come once, after the retried
forwards (see ``docs/sharp_edges.md``).
"""

from __future__ import annotations

import gc

import torch

from dplora.engine.batch import collate, per_sequence_loss
from dplora.errors import TrainingFailedError

CPU_DEFAULT = 8  # records per forward on CPU (the contract's default)
PROBE_CAP = 64  # the largest physical batch the CUDA probe tries


def is_oom(err: BaseException) -> bool:
    """``err`` is an accelerator out-of-memory error (``torch.OutOfMemoryError``; host ``MemoryError`` is not)."""
    return isinstance(err, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError))


def reset_after_oom(model: torch.nn.Module, optimizer, named) -> None:
    """Drop everything a forward/backward interrupted by an out-of-memory error left behind, so it can be re-run.

    Clears each trainable tensor's ``.grad`` and ``.grad_sample``, Opacus hooks' captured ``activations``, the fast
    path's (B, P) buffer (freed, not only disarmed: :meth:`dplora.engine.fastclip.FlatLoRAGrads.release`, so a
    smaller batch after a probe or a retry does not keep the larger try's rows) and the optimizer's per-unit
    clipped sum (:meth:`UnitDPOptimizer.begin_logical_step`); frees the CUDA cache. Adds no noise and steps no
    accountant.
    """
    for _, p in named:
        p.grad = None
        if hasattr(p, "grad_sample"):
            p.grad_sample = None
    for m in model.modules():
        if hasattr(m, "activations"):
            m.activations = []
    flat = getattr(optimizer, "flat", None)
    if flat is not None:
        flat.release()
    if hasattr(optimizer, "begin_logical_step"):
        optimizer.begin_logical_step(0)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def synthetic_batch(batch_size: int, max_seq_len: int) -> list[tuple[list[int], list[int]]]:
    """``batch_size`` records of ``max_seq_len`` tokens, every token a target: (input_ids, labels) pairs of token 1.

    Memory depends on the shape, not on the token values; no private record is read.
    """
    ids = [1] * max_seq_len
    return [(ids, ids) for _ in range(batch_size)]


def _try_batch(model, optimizer, named, batch_size: int, max_seq_len: int, pad_id: int, device) -> None:
    """One forward/backward of a synthetic batch through the active per-example path and the unit accumulator."""
    batch = collate(synthetic_batch(batch_size, max_seq_len), pad_id, device=device)
    optimizer.begin_logical_step(0)
    optimizer.prepare_batch(batch_size)
    per_sequence_loss(model, batch).sum().backward()
    host = torch.device("cpu")  # host-side bookkeeping, as the loop passes it (no device sync)
    optimizer.accumulate(torch.arange(batch_size, device=host), row_weight=torch.ones(batch_size, device=host))
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probe_physical_batch(
    model, optimizer, named, *, max_seq_len: int, pad_id: int, device, cap: int = PROBE_CAP, probe_cpu: bool = False
) -> int:
    """The largest physical batch ≤ ``cap`` (halving from ``cap``) whose forward and backward fit in memory.

    Args:
        model: the model to forward (the Opacus wrapper or the fast-path peft model), in train mode.
        optimizer: the :class:`dplora.mechanism.optimizer.UnitDPOptimizer` (its per-unit sum is reset afterwards) or the
            non-private control's optimizer.
        named: (name, parameter) of the trainable tensors.
        max_seq_len: tokens per synthetic record (the contract's ``training.max_seq_len``).
        pad_id: the tokenizer's pad token id.
        device: the parameters' device; on CPU the answer is :data:`CPU_DEFAULT` without probing.
        cap: the first batch tried (records).
        probe_cpu: probe on CPU too (tests simulate out-of-memory errors).

    Returns:
        Records per forward, 1 ≤ value ≤ cap.

    Raises:
        TrainingFailedError: one record of ``max_seq_len`` tokens does not fit.
    """
    if device.type != "cuda" and not probe_cpu:
        return CPU_DEFAULT
    batch_size = cap
    while True:
        try:
            _try_batch(model, optimizer, named, batch_size, max_seq_len, pad_id, device)
            return batch_size
        except Exception as err:
            if not is_oom(err):
                raise
            if batch_size == 1:
                raise TrainingFailedError(
                    f"out of accelerator memory with one record of training.max_seq_len={max_seq_len} tokens: "
                    "lower it or turn on training.gradient_checkpointing"
                ) from None
            batch_size //= 2
        finally:
            reset_after_oom(model, optimizer, named)


def time_synthetic_step(
    model, optimizer, named, *, batch_size: int, max_seq_len: int, pad_id: int, device
) -> float | None:
    """Wall seconds of one forward and backward of ``batch_size`` synthetic records of ``max_seq_len`` tokens.

    The time probe of the public estimate (:mod:`dplora.plan.estimate`): the records are :func:`synthetic_batch`
    (token id 1, no data), through the active per-example path and the unit accumulator as in a real step; no
    optimizer step, no noise, no accountant step; everything is reset afterwards (:func:`reset_after_oom`). One
    untimed run first absorbs first-call costs (allocations, lazy initialisation, CUDA kernels): on
    ``configs/demo.yaml`` (SmolLM2-135M, CPU, one thread) the estimate from a single timed run was about 2x the
    measured 10.3-10.9 s steps; with the warm-up it said 16.4 s/step against measured 14.2-15.8 s on a busier
    machine.

    Returns:
        Seconds, or None when the batch does not fit in accelerator memory (no estimate then).

    Raises:
        Any non-out-of-memory error of the forward or backward.
    """
    import time

    try:
        _try_batch(model, optimizer, named, batch_size, max_seq_len, pad_id, device)  # untimed: first-call costs
        reset_after_oom(model, optimizer, named)
        start = time.perf_counter()
        _try_batch(model, optimizer, named, batch_size, max_seq_len, pad_id, device)
        return time.perf_counter() - start
    except Exception as err:
        if not is_oom(err):
            raise
        return None
    finally:
        reset_after_oom(model, optimizer, named)
