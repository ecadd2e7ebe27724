"""Per-example gradient rows from the model side: the Opacus wrapper and its rows, the probe before step 1.

Rows come from either per-sample path: dplora's fast LoRA path (:class:`dplora.engine.fastclip.FlatLoRAGrads`) or
Opacus ``GradSampleModule`` hooks (:func:`opacus_module`, copied into one (B, P) buffer by :func:`opacus_flat`).
:func:`assign_flat_grads` writes a flat (P,) vector back as each tensor's ``.grad``. What is done with the rows
(clip, sum, noise) is :mod:`dplora.mechanism`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from opacus import GradSampleModule

from dplora.errors import TrainingFailedError


def assign_flat_grads(params: Sequence[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Set each parameter's ``.grad`` to its view of ``flat`` (P,), in the column order of G (no copy)."""
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).to(p.dtype)
        offset += n
    if offset != flat.numel():
        raise ValueError(f"flat gradient has {flat.numel()} values, the parameters {offset}")


def opacus_flat(
    params: Sequence[torch.nn.Parameter], out: torch.Tensor | None = None, *, expected_rows: int | None = None
) -> torch.Tensor:
    """Copy Opacus ``p.grad_sample`` (B, *p.shape) of each parameter into one (B, P) fp32 buffer; clears them.

    Columns follow ``params`` order (use :attr:`FlatLoRAGrads.named_params` order for the same layout).

    Args:
        params: the trainable tensors, in column order.
        out: a (B, P) fp32 buffer to fill, or None (allocated).
        expected_rows: B, the physical batch's records (the engine passes it): every ``grad_sample`` must have
            exactly B rows. Opacus takes its rows from dimension 0 of each layer's input, so a layer that sees
            (tokens, batch, features) gives one row per position; None: rows from the first tensor.

    Raises:
        TrainingFailedError: a parameter has no per-sample gradient (names its shape), or a parameter's rows are
            not ``expected_rows`` (nor those of ``out``).
    """
    samples = []
    for p in params:
        gs = getattr(p, "grad_sample", None)
        if gs is None:
            raise TrainingFailedError(f"a trainable tensor of shape {tuple(p.shape)} got no per-sample gradient")
        samples.append(torch.cat(gs, dim=0) if isinstance(gs, list) else gs)
        p.grad_sample = None
    rows = samples[0].shape[0] if samples else 0
    if expected_rows is None and out is not None:
        expected_rows = out.shape[0]
    if expected_rows is not None:
        for p, gs in zip(params, samples, strict=True):
            if gs.shape[0] != expected_rows:
                raise TrainingFailedError(
                    f"a trainable tensor of shape {tuple(p.shape)} got {gs.shape[0]} per-sample gradient rows for a "
                    f"physical batch of {expected_rows} records: a layer does not keep the batch in dimension 0"
                )
        rows = expected_rows
    total = sum(p.numel() for p in params)
    if out is None:
        out = torch.empty((rows, total), dtype=torch.float32, device=samples[0].device if samples else "cpu")
    offset = 0
    for p, gs in zip(params, samples, strict=True):
        out[:, offset : offset + p.numel()].copy_(gs.reshape(rows, -1))
        offset += p.numel()
    return out


def opacus_module(model: torch.nn.Module) -> GradSampleModule:
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
