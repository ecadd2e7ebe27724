"""Fast per-example gradients for peft LoRA: every example's LoRA gradient, written into one (B, P) buffer.

For a peft ``lora.Linear`` with input x (B, T, d_in) (after LoRA dropout), scaling s, A (r, d_in), B (d_out, r),
the LoRA branch is s·(x Aᵀ) Bᵀ and, with the upstream gradient g (B, T, d_out), each example's gradients are

    grad_B[b] = Σ_t g[b,t]ᵀ (s·x[b,t] Aᵀ)          (d_out, r)
    grad_A[b] = Σ_t (s·g[b,t] B)ᵀ x[b,t]           (r, d_in)

one batched matmul each (grad_A is skipped when A is frozen: FFA-LoRA, ``lora.freeze_a``), the FLOPs of the
ordinary gradient without the sum over b (Goodfellow 2015, "Efficient per-example gradient computations";
``../shared/DESIGN-fast-clipping.md``). :class:`FlatLoRAGrads`
replaces each LoRA layer's ``forward`` (per instance; the class and the base layer are untouched) by the base
layer plus a custom autograd Function whose backward writes these into the layer's column slice of one
preallocated buffer G (B, P) fp32, P = all LoRA parameters. It returns the input gradient as usual and no
``.grad`` for A and B: the caller writes ``.grad`` from the clipped, noised sum (:mod:`dplora.mechanism.clipping`).

LoRA dropout is exact: the Function receives the dropped-out input the forward used, so each example's gradient
is the gradient of the forward that ran. A 4-bit NF4 base (peft ``lora.bnb.Linear4bit``) takes the same path: its
base layer de-quantizes weights only, so x and g are per-example as for a plain linear. Base weights may be bf16:
the input is saved in its own dtype and cast to the LoRA dtype (fp32) inside the Function, as peft does;
per-example gradients are always fp32.

Gradient checkpointing: with torch's NON-reentrant checkpoint (``torch.utils.checkpoint``,
``use_reentrant=False``, as transformers' ``activation_checkpointing_enable`` installs it) the recomputed forward
only refills the saved tensors of the ORIGINAL graph; the original graph's backward is the one that runs, so each
LoRA call's backward (and its write into G) runs exactly once. The recomputation restores the RNG state
(``preserve_rng_state=True``, torch's default), so LoRA dropout draws the same masks the loss used. Both are checked,
not assumed: every armed generation counts each layer's forwards outside a backward (recomputations run inside one)
and its writes, and :meth:`FlatLoRAGrads.gradients` refuses a layer whose counts differ. Reentrant checkpointing is
refused (it re-runs the forward and a second backward under its own graph).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch

from dplora.errors import TrainingFailedError, UncoveredParameterError


@dataclasses.dataclass(eq=False)
class _Slot:
    """Where one LoRA layer's per-example gradients go: columns [off_a, off_a + r·d_in) and [off_b, off_b + d_out·r);
    ``off_a`` is None when A is frozen (FFA-LoRA, ``lora.freeze_a``): A then has no columns and nothing is written."""

    owner: FlatLoRAGrads
    name_a: str
    off_a: int | None
    off_b: int
    r: int
    d_in: int
    d_out: int
    scaling: float
    generation: int = -1  # the buffer generation this slot last wrote
    forwards: int = 0  # forwards with grad outside a backward since the buffer was armed (recomputations excluded)
    writes: int = 0  # backward writes into G since the buffer was armed

    def write(self, gbs: torch.Tensor, x: torch.Tensor, g: torch.Tensor, hs: torch.Tensor) -> None:
        """Write (first backward of a generation) or add (a layer called again) s·gBᵀx and gᵀ(s·h) into G."""
        G = self.owner._armed
        if G is None:
            raise TrainingFailedError(
                "fast per-example gradients: a backward ran with no armed buffer; call FlatLoRAGrads.buffer(B) first"
            )
        rows = G.shape[0]
        if g.shape[0] != rows:
            raise TrainingFailedError(f"fast per-example gradients: the backward has batch {g.shape[0]}, buffer {rows}")
        view_b = G[:, self.off_b : self.off_b + self.d_out * self.r].view(rows, self.d_out, self.r)
        view_a = None
        if self.off_a is not None:
            view_a = G[:, self.off_a : self.off_a + self.r * self.d_in].view(rows, self.r, self.d_in)
        self.writes += 1
        if self.generation != self.owner._generation:
            if view_a is not None:
                torch.bmm(gbs.transpose(1, 2), x, out=view_a)
            torch.bmm(g.transpose(1, 2), hs, out=view_b)
            self.generation = self.owner._generation
        else:
            if view_a is not None:
                view_a.baddbmm_(gbs.transpose(1, 2), x)
            view_b.baddbmm_(g.transpose(1, 2), hs)


class _LoRAPerExample(torch.autograd.Function):
    """s·(x Aᵀ) Bᵀ for x (B, T, d_in); backward returns dL/dx and writes per-example dL/dA, dL/dB into G."""

    @classmethod
    def apply(cls, x, weight_a, weight_b, slot):
        """Count an original forward (grad on, outside a backward: a checkpoint recomputation runs inside one)."""
        if torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1:
            slot.forwards += 1
        return super().apply(x, weight_a, weight_b, slot)

    @staticmethod
    def forward(ctx, x, weight_a, weight_b, slot):
        hs = (x.to(weight_a.dtype) @ weight_a.t()) * slot.scaling  # (B, T, r), LoRA dtype
        ctx.save_for_backward(x, hs, weight_a, weight_b)  # x in its own dtype: bf16 stays bf16
        ctx.slot = slot
        return hs @ weight_b.t()  # (B, T, d_out)

    @staticmethod
    def backward(ctx, g):
        x, hs, weight_a, weight_b = ctx.saved_tensors
        slot = ctx.slot
        if x.dim() != 3:
            raise TrainingFailedError(f"per-example gradients need a (batch, tokens, features) input: {slot.name_a}")
        g = g.to(weight_a.dtype)
        gbs = (g @ weight_b) * slot.scaling  # (B, T, r)
        xf = x.to(weight_a.dtype)
        slot.write(gbs, xf, g, hs)
        grad_x = (gbs @ weight_a).to(x.dtype) if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None


def _fast_forward(layer, slot: _Slot, adapter: str, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """peft ``lora.Linear.forward`` for one vanilla adapter, with the LoRA branch through :class:`_LoRAPerExample`."""
    if kwargs.get("adapter_names") is not None:
        raise TrainingFailedError("fast per-example gradients do not support peft mixed-batch adapter_names")
    result = layer.base_layer(x, *args, **kwargs)
    if layer.disable_adapters:
        return result
    x_dropped = layer.lora_dropout[adapter](x)
    lora = _LoRAPerExample.apply(x_dropped, layer.lora_A[adapter].weight, layer.lora_B[adapter].weight, slot)
    return (result + lora).to(result.dtype)


def checkpointing_mode(model: torch.nn.Module) -> str:
    """ "off", "non-reentrant" or "reentrant": transformers' activation checkpointing on any submodule of ``model``.

    Read from the ``_gradient_checkpointing_func`` (a ``functools.partial`` of ``torch.utils.checkpoint.checkpoint``)
    that transformers sets on each layer; anything but an explicit ``use_reentrant=False`` counts as reentrant.
    """
    mode = "off"
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is True:
            keywords = getattr(getattr(module, "_gradient_checkpointing_func", None), "keywords", None) or {}
            if keywords.get("use_reentrant", True) is not False:
                return "reentrant"
            mode = "non-reentrant"
    return mode


def _lora_classes() -> tuple[type, ...]:
    """peft's LoRA layers whose branch is ``B(A(dropout(x)))`` on the base layer's input x: ``lora.Linear`` and,
    when bitsandbytes is installed, ``lora.bnb.Linear4bit`` (an NF4 base layer; the LoRA branch is the same)."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    classes: tuple[type, ...] = (LoraLinear,)
    try:
        from peft.tuners.lora import bnb as lora_bnb
    except ImportError:
        return classes
    linear4bit = getattr(lora_bnb, "Linear4bit", None)  # defined only when bitsandbytes 4-bit is available
    return classes if linear4bit is None else (*classes, linear4bit)


def _lora_layers(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    classes = _lora_classes()
    for name, module in model.named_modules():
        if isinstance(module, classes):
            yield name, module


class FlatLoRAGrads:
    """Per-example LoRA gradients of a peft model, written by the backward into one buffer G (B, P) fp32.

    Usage for one physical batch of B examples (``losses``: (B,) one loss per sequence, see
    :func:`dplora.engine.batch.per_sequence_loss`)::

        flat = FlatLoRAGrads(peft_model)      # refuses any trainable tensor it does not cover
        G = flat.buffer(B)                    # armed for the next backward
        losses.sum().backward()               # row b of G: d losses[b] / d θ, θ = all LoRA tensors, flat
        G = flat.gradients()                  # checks every LoRA layer wrote its slice
        ...                                   # clip, sum, noise (dplora.mechanism.clipping)
        flat.remove()                         # plain peft forward again

    Attributes:
        named_params: the covered (name, parameter) pairs in the model's ``named_parameters`` order; their
            gradients are the columns [offsets[i], offsets[i] + numel) of G, flattened in row-major order.
        offsets: the first column of each parameter in G.
        P: the number of trainable LoRA parameters (columns of G); a frozen A (FFA-LoRA, ``lora.freeze_a``) has no
            columns, so it gets no per-example gradient, no noise and no update.

    Raises (constructor):
        UncoveredParameterError: a trainable tensor is not the A or B weight of a vanilla peft ``lora.Linear`` or
            ``lora.bnb.Linear4bit`` (DoRA, 8-bit layers and other variants, LoRA bias, embeddings, trainable base
            weights), naming the first one.
        TrainingFailedError: reentrant gradient checkpointing is on (non-reentrant is exact, see the module doc), or
            a LoRA layer is merged or has several active adapters.
    """

    def __init__(self, model: torch.nn.Module):
        if checkpointing_mode(model) == "reentrant":
            raise TrainingFailedError(
                "reentrant gradient checkpointing re-runs backwards: use use_reentrant=False for per-example gradients"
            )
        names = {id(p): n for n, p in model.named_parameters()}
        layers = []
        for layer_name, layer in _lora_layers(model):
            adapters = [a for a in layer.active_adapters if a in layer.lora_A]
            if not adapters:
                continue
            if len(adapters) != 1 or layer.merged:
                raise TrainingFailedError(f"LoRA layer {layer_name}: one active, unmerged adapter is needed")
            adapter = adapters[0]
            if adapter in getattr(layer, "lora_variant", {}) or layer.lora_B[adapter].bias is not None:
                continue  # DoRA, LoRA bias, ...: their tensors stay uncovered and are refused below
            layers.append((layer, adapter))
        # a frozen A (FFA-LoRA, lora.freeze_a) gets no columns: only trainable tensors are covered
        covered = {
            id(p) for layer, a in layers for p in (layer.lora_A[a].weight, layer.lora_B[a].weight) if p.requires_grad
        }
        for name, p in model.named_parameters():
            if p.requires_grad and id(p) not in covered:
                raise UncoveredParameterError(
                    f"trainable tensor {name} is not a vanilla LoRA A/B weight: the fast per-example path does not "
                    "cover it; freeze it or use privacy.per_sample: opacus"
                )
        self.named_params: list[tuple[str, torch.nn.Parameter]] = [
            (n, p) for n, p in model.named_parameters() if id(p) in covered
        ]
        self.offsets: list[int] = []
        offset_of: dict[int, int] = {}
        total = 0
        for _, p in self.named_params:
            self.offsets.append(total)
            offset_of[id(p)] = total
            total += p.numel()
        self.P: int = total
        self._generation = 0
        self._armed: torch.Tensor | None = None
        self._storage: torch.Tensor | None = None
        self._slots: list[_Slot] = []
        self._layers = []
        for layer, adapter in layers:
            a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
            if not b.requires_grad:  # B frozen: A alone is not a LoRA variant this path covers
                if a.requires_grad:
                    raise UncoveredParameterError(
                        f"trainable tensor {names[id(a)]}: its B is frozen; the fast per-example path needs B trained"
                    )
                continue  # a fully frozen layer: no columns, its forward stays peft's own
            slot = _Slot(
                owner=self,
                name_a=names[id(a)],
                off_a=offset_of.get(id(a)),
                off_b=offset_of[id(b)],
                r=a.shape[0],
                d_in=a.shape[1],
                d_out=b.shape[0],
                scaling=float(layer.scaling[adapter]),
            )
            self._slots.append(slot)
            self._layers.append(layer)
            layer.forward = self._bound_forward(layer, slot, adapter)

    @staticmethod
    def _bound_forward(layer, slot, adapter):
        def forward(x, *args, **kwargs):
            return _fast_forward(layer, slot, adapter, x, *args, **kwargs)

        return forward

    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        """The covered parameters, in column order of G."""
        return [p for _, p in self.named_params]

    def buffer(self, batch_size: int) -> torch.Tensor:
        """Arm the buffer for the next backward of ``batch_size`` examples and return it: shape (B, P), fp32.

        The storage is reused across calls (reallocated only when B grows, or after :meth:`release`), and not
        zeroed: each layer's first backward overwrites its slice. Read it through :meth:`gradients`, which checks
        that every slice was written.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: expected >= 1 (never forward an empty batch)")
        device = self.named_params[0][1].device if self.named_params else torch.device("cpu")
        if self._storage is None or self._storage.shape[0] < batch_size or self._storage.device != device:
            self._storage = None  # free the old one first
            self._storage = torch.empty((batch_size, self.P), dtype=torch.float32, device=device)
        self._generation += 1
        for slot in self._slots:
            slot.forwards = slot.writes = 0
        self._armed = self._storage[:batch_size]
        return self._armed

    def gradients(self) -> torch.Tensor:
        """The armed buffer after the backward: (B, P) fp32, row b = example b's gradient; disarms it.

        Raises:
            TrainingFailedError: no buffer is armed, a LoRA layer wrote no gradient, or its backward wrote a number of
                times other than its forwards ran (a recomputed forward registered twice; names its A tensor).
        """
        if self._armed is None:
            raise TrainingFailedError("fast per-example gradients: no armed buffer; call buffer(B) before backward")
        for slot in self._slots:
            if slot.generation != self._generation:
                raise TrainingFailedError(f"trainable tensor {slot.name_a} got no per-example gradient")
            if slot.writes != slot.forwards:
                raise TrainingFailedError(
                    f"trainable tensor {slot.name_a}: {slot.writes} per-example gradient writes for {slot.forwards} "
                    "forwards in one backward"
                )
        G, self._armed = self._armed, None
        return G

    def release(self) -> None:
        """Disarm and free the storage; the next :meth:`buffer` allocates exactly the rows it is asked for.

        Called after each try of the ``physical_batch_size: auto`` probe and after an out-of-memory retry
        (:func:`dplora.engine.membatch.reset_after_oom`): the storage only grows, so without it the probe's largest
        try (64 rows) would stay allocated for the whole run after it settles on fewer (B × P × 4 bytes: 10.7 GB
        of dead storage at 8 of 64 rows on Llama-3.1-8B with r 16 on all 7 projections).
        """
        self._armed = self._storage = None

    @contextlib.contextmanager
    def suspended(self):
        """Within the block every layer runs peft's own forward (plain autograd ``.grad`` for A and B, no writes
        into G); the per-example forwards are put back on exit. Used by :mod:`dplora.engine.gradcheck`'s reference."""
        saved = [(layer, layer.__dict__.pop("forward", None)) for layer in self._layers]
        try:
            yield
        finally:
            for layer, forward in saved:
                if forward is not None:
                    layer.forward = forward

    def remove(self) -> None:
        """Restore peft's own forward on every layer and free the buffer."""
        for layer in self._layers:
            layer.__dict__.pop("forward", None)
        self._layers, self._slots = [], []
        self._armed = self._storage = None
