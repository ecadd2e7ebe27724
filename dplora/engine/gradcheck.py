"""Before step 1: the active per-example gradient path against a one-record-at-a-time backward.

A per-example path can be wrong in ways that leave every shape plausible: a layer that sees (tokens, batch,
features) tensors (XLNet's feed-forward layers) gets Opacus "per-sample" gradients per *position*, and when the
padded length equals the batch size the row count is even right. Only a comparison with the gradient
of each record's own loss catches it. :func:`check_per_example_gradients` runs that comparison on synthetic token
batches (no private data): one whose padded length L differs from its batch size B and one where L = B, each
record with a repeated token (cross-token terms, cases F1; kept as they are), and one with no token twice
in the batch, where query/key LoRA gradients are not zero (on a record of one repeated token attention averages
equal values, so every query/key gradient there is mathematically zero and both sides are rounding):

1. the batched pass through the active path gives G (B, P): :class:`dplora.engine.fastclip.FlatLoRAGrads` rows (fast) or
   Opacus ``grad_sample`` (opacus), checked first to have exactly B rows;
2. each record alone, padded to the same width L (right padding: the real tokens see the same context), through
   plain autograd (the fast path's forwards suspended, Opacus hooks disabled) gives the reference row;
3. every trainable tensor's block of each row must match: ‖g − r‖₂ ≤ rtol·max(‖r‖₂ + 0.01·‖r_record‖₂, s), with
   s = FLOOR_REL = 1e-2 of the largest reference row norm over the check's batches (a floor relative to the
   check's own scale, never a fixed absolute one). A floor of 1e-6 of the batch's largest row is too small: on a
   q_proj-only LoRA the repeated-token batch's rows are all rounding, so a per-batch scale is rounding too, and the
   rounding measured (below) is up to 3.9e-6 of the check's largest row, far above rtol·1e-6.

Randomness is held fixed between the batched and the one-record passes: every torch dropout module (LoRA dropout
and the base model's) is replaced, for the check only, by :class:`_HeldDropout`, which draws one mask per call of
the batched pass from its own seeded generator and gives record i row i of that mask in the one-record pass (the
batch dimension is the one whose size went from B to 1). Its ``p`` reads 0, so attention code that hands
``dropout.p`` to a fused kernel draws nothing. Dropout that a model takes from a config float in a functional call
is not held fixed: the check then refuses (set that dropout to 0).

LoRA B is zero at initialisation, which makes every LoRA A gradient zero; the check therefore runs at a point
where each all-zero trainable tensor holds small values from a fixed-seed generator, so both A and B are checked.
Everything is restored exactly afterwards (parameters, ``.grad``, ``grad_sample``, buffers, dropout modules, train
modes, Opacus's per-module state, the fast path's buffer); the optimizer, its noise generator and the accountant
are never touched, and torch's global generator is not drawn from.

Tolerance: rtol 5e-3 when the model computes in fp32, 0.1 with bf16/fp16 base weights or a 4-bit base's bf16/fp16
compute (measured on CPU: tiny Llama fp32 1.3e-6, bf16 ≤ 1.4e-2 fast, 0 Opacus; the packaged SmolLM2-135M in fp32
2.8e-4, in layer 0's lora_A). A wrong per-example path differs by O(1) (0.31 for a (tokens, batch, features) layer).
TF32 is off for the check's duration (``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32``
set False, then restored): with TF32 on, cuBLAS may round the batched and the one-record products differently
(10-bit mantissa inputs), and the check would measure TF32 rather than the per-example path it is there to test.
Floor (measured 2026-12-03, CPU, 2 threads): a mathematically zero block differs by ≤ 3.9e-6 of the check's largest
row (SmolLM2-135M, q_proj or k_proj alone, fast and Opacus; before the floor: "relative difference 1.12 > 0.005"),
≤ 1.0e-6 on the tiny architectures at hidden 128, 4 layers; rtol·s = 5e-5 of it leaves a 12x margin, and a
per-token norm in place of the cross-token sum is still off by O(1) of the record's own row. With bf16/fp16
arithmetic the floor is :data:`FLOOR_REL_HALF` = 0.1 of the largest row: on CUDA the batched and one-record passes
may run different GEMM kernels, so a zero block is rounding at bf16 resolution (unit roundoff 2^-8 = 3.9e-3 of the
activations), above the fp32 floor's rtol·s = 1e-3; rtol·s = 1e-2 there is 2.6 units of roundoff. (On CPU both
passes agree to 0 in bf16 on the tiny architectures; the per-token error below still fails in bf16.) The check
logs its largest relative difference (:func:`probe_per_sample_gradients`), so a GPU run shows its margin.

Sources: Goodfellow 2015 (per-example gradients); Opacus ``GradSampleModule`` (batch_first hooks); the brute-force
references of the Opacus test suite (``opacus/tests/grad_samples``).
"""

from __future__ import annotations

import contextlib

import torch

from dplora.engine import batch as batching
from dplora.errors import TrainingFailedError

RTOL_FP32 = 5e-3  # 2.8e-4 measured on the packaged SmolLM2-135M (fp32, CPU); a wrong path differs by O(1)
RTOL_HALF = 1e-1
PERTURB_STD = 0.05
MASK_SEED = 20221
# The floor of the comparison: FLOOR_REL of the check's largest reference row norm. A tensor whose gradient is
# mathematically zero on a batch (query/key LoRA on a record of one repeated token) is fp32 rounding on both sides:
# measured ‖fast − ref‖ ≤ 3.9e-6 of the largest row (SmolLM2-135M q_proj/k_proj, 2 threads, fast and Opacus), so
# rtol·FLOOR_REL = 5e-5 of it is a 12x margin; tiny archs at hidden 128, 4 layers: ≤ 1.0e-6. A per-token norm in
# place of the cross-token sum differs by O(1) of the record's own row (cases F1).
FLOOR_REL = 1e-2
# bf16/fp16 arithmetic: rtol·FLOOR_REL_HALF = 1e-2 of the largest row, 2.6 bf16 units of roundoff (2^-8): on CUDA the
# batched and one-record passes may pick different cuBLAS kernels, and a zero block is then bf16 rounding.
FLOOR_REL_HALF = 1e-1

# (input_ids) of the synthetic records; labels equal ids except where a prompt token is masked (-100).
# Batch "L != B": 3 records padded to 5 tokens; batch "L == B": 3 records padded to 3 tokens; both repeat tokens
# (cross-token terms, cases F1). Batch "distinct": 3 records padded to 4 tokens, no token twice in the batch, so that
# query/key gradients (zero on a record of one repeated token: attention over equal values) are non-zero.
_BATCHES = (
    ([7, 7, 7, 9, 11], [3, 5, 3], [12, 13, 14, 14]),
    ([4, 4, 6], [8, 10], [9, 9, 9]),
    ([15, 2, 16, 17], [18, 19, 20], [21, 22, 23, 24]),
)


def synthetic_batches(vocab_size: int) -> list[list[tuple[list[int], list[int]]]]:
    """The check's three batches of (input_ids, labels) records, token ids in [1, vocab_size).

    Returns:
        Three batches of 3 records each: padded to 5 tokens (L ≠ B), to 3 (L = B), both with a record of one
        repeated token, and to 4 tokens with no token twice in the batch. Each batch has one record whose first
        token is a masked prompt (−100).
    """
    if vocab_size < 3:
        raise ValueError(f"vocab_size={vocab_size}: expected >= 3")
    out = []
    for records in _BATCHES:
        batch = []
        for j, ids in enumerate(records):
            ids = [1 + (t - 1) % (vocab_size - 1) for t in ids]
            labels = list(ids)
            if j == 1:
                labels[0] = -100
            batch.append((ids, labels))
        out.append(batch)
    return out


class _HeldDropout(torch.nn.Module):
    """Stand-in for a dropout module during the check: fixed masks, replayed row by row (see the module doc)."""

    def __init__(self, name: str, rate: float):
        super().__init__()
        self.name, self.rate = name, float(rate)
        self.p = 0.0  # what fused attention kernels read: no draw outside this module's own masks
        self.masks: list[torch.Tensor] = []
        self.calls = 0
        self.row: int | None = None  # None: the batched pass draws; i: the one-record pass of record i
        self._generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(MASK_SEED)
        return self._generators[device]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, self.calls = self.calls, self.calls + 1
        if self.rate <= 0.0:
            return x
        if self.rate >= 1.0:
            return x * 0.0
        if self.row is None:
            keep = torch.rand(x.shape, generator=self._generator(x.device), device=x.device) >= self.rate
            mask = keep.to(x.dtype) / (1.0 - self.rate)
            self.masks.append(mask)
            return x * mask
        if k >= len(self.masks):
            raise TrainingFailedError(f"per-example check: dropout {self.name} ran more often for one record")
        return x * _row_of(self.masks[k], tuple(x.shape), self.row, self.name)


def _row_of(mask: torch.Tensor, shape: tuple[int, ...], row: int, name: str) -> torch.Tensor:
    """Record ``row``'s slice of a batched mask for an input of ``shape``: along the one dimension that went B → 1."""
    if tuple(mask.shape) == shape:
        return mask
    differ = [d for d in range(mask.dim()) if mask.dim() == len(shape) and mask.shape[d] != shape[d]]
    if len(differ) != 1 or shape[differ[0]] != 1:
        raise TrainingFailedError(
            f"per-example check: dropout {name} sees {tuple(mask.shape)} in a batch and {shape} for one record: "
            "no batch dimension to hold its mask fixed"
        )
    return mask.narrow(differ[0], row, 1)


@contextlib.contextmanager
def _held_dropout(model: torch.nn.Module):
    """Replace every torch dropout module by a :class:`_HeldDropout`; yields them; puts the originals back."""
    swapped = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent._modules.items()):
            if isinstance(child, torch.nn.modules.dropout._DropoutNd):
                held = _HeldDropout(f"{parent_name}.{child_name}".lstrip("."), child.p)
                parent._modules[child_name] = held
                swapped.append((parent, child_name, child, held))
    try:
        yield [held for *_, held in swapped]
    finally:
        for parent, child_name, child, _ in swapped:
            parent._modules[child_name] = child


class _Saved:
    """What the check may change, saved so that it can be put back exactly."""

    def __init__(self, model: torch.nn.Module):
        self.params = list(model.parameters())
        self.values = {id(p): p.detach().clone() for p in self.params if p.requires_grad}
        self.grads = {id(p): p.grad for p in self.params}
        self.grad_samples = {id(p): (hasattr(p, "grad_sample"), getattr(p, "grad_sample", None)) for p in self.params}
        self.counters = {id(p): getattr(p, "_forward_counter", None) for p in self.params}
        self.buffers = [(b, b.detach().clone()) for b in model.buffers()]
        self.modules = list(model.modules())
        self.training = [m.training for m in self.modules]
        self.activations = {id(m): list(m.activations) for m in self.modules if hasattr(m, "activations")}
        self.batch_lens = {id(m): m.max_batch_len for m in self.modules if hasattr(m, "max_batch_len")}

    def restore(self) -> None:
        with torch.no_grad():
            for p in self.params:
                if id(p) in self.values:
                    p.copy_(self.values[id(p)])
                p.grad = self.grads[id(p)]
                had, value = self.grad_samples[id(p)]
                if had:
                    p.grad_sample = value
                elif hasattr(p, "grad_sample"):
                    del p.grad_sample
                if self.counters[id(p)] is not None:
                    p._forward_counter = self.counters[id(p)]
                if hasattr(p, "_current_grad_sample"):
                    del p._current_grad_sample
            for b, value in self.buffers:
                b.copy_(value)
        for m, mode in zip(self.modules, self.training, strict=True):
            m.training = mode
            if id(m) in self.activations:
                m.activations = self.activations[id(m)]
            elif hasattr(m, "activations"):
                del m.activations
            if id(m) in self.batch_lens:
                m.max_batch_len = self.batch_lens[id(m)]
            elif hasattr(m, "max_batch_len"):
                del m.max_batch_len


def _half(model: torch.nn.Module) -> bool:
    """Whether the model computes in bf16/fp16 anywhere: such weights, or a 4-bit base's compute dtype."""
    if any(p.dtype in (torch.bfloat16, torch.float16) for p in model.parameters()):
        return True
    # a 4-bit base (bitsandbytes Linear4bit) stores uint8 weights and computes in its compute_dtype
    return any(getattr(m, "compute_dtype", None) in (torch.bfloat16, torch.float16) for m in model.modules())


def _tolerance(model: torch.nn.Module) -> tuple[float, float]:
    """(rtol, floor relative to the check's largest reference row) for the model's arithmetic.

    bf16/fp16 anywhere: (:data:`RTOL_HALF`, :data:`FLOOR_REL_HALF`); else fp32: (:data:`RTOL_FP32`,
    :data:`FLOOR_REL`). TF32 is not a case: it is off during the check (:func:`_tf32_off`).
    """
    return (RTOL_HALF, FLOOR_REL_HALF) if _half(model) else (RTOL_FP32, FLOOR_REL)


@contextlib.contextmanager
def _tf32_off():
    """TF32 off for fp32 matmuls and cuDNN within the block; the caller's settings restored afterwards.

    Source: PyTorch docs, "TensorFloat-32 (TF32) on Ampere (and later) devices" (``allow_tf32`` flags). The flags
    are process-wide; on CPU they change nothing.
    """
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def _vocab_size(model: torch.nn.Module) -> int:
    inner = model._module if hasattr(model, "_module") else model
    try:
        return int(inner.get_input_embeddings().num_embeddings)
    except (AttributeError, NotImplementedError):
        return 16


def _layer_of(name: str) -> str:
    """The layer of a trainable tensor's name (peft: ``<layer>.lora_A.<adapter>.weight``)."""
    for marker in (".lora_A.", ".lora_B."):
        if marker in name:
            return name.split(marker)[0]
    return name.rsplit(".", 1)[0]


def _plain_reference(model, flat, params, batch, per_sequence_loss) -> torch.Tensor:
    """One record's gradient by plain autograd (fast forwards suspended / Opacus hooks disabled): flat (P,) fp32."""
    for p in params:
        p.grad = None
    hooks = model if hasattr(model, "disable_hooks") else None
    suspend = flat.suspended() if flat is not None else contextlib.nullcontext()
    with suspend:
        if hooks is not None:
            hooks.disable_hooks()
        try:
            per_sequence_loss(model, batch).sum().backward()
        finally:
            if hooks is not None:
                hooks.enable_hooks()
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float() for p in params]
    for p in params:
        p.grad = None
    return torch.cat(parts)


def _batched_rows(model, flat, params, names, batch, size: int, per_sequence_loss) -> torch.Tensor:
    """The active path's per-example rows for the batch: (B, P) fp32. Raises when a tensor's rows are not B."""
    from dplora.engine.perexample import opacus_flat

    if flat is not None:
        flat.buffer(size)
    try:
        per_sequence_loss(model, batch).sum().backward()
    except BaseException:
        if flat is not None:
            flat._armed = None
        raise
    if flat is not None:
        G = flat.gradients().clone()
    else:
        for p in params:
            gs = getattr(p, "grad_sample", None)
            rows = gs.shape[0] if torch.is_tensor(gs) else None
            if rows is not None and rows != size:
                raise TrainingFailedError(
                    f"per-example check: layer {_layer_of(names[id(p)])} (tensor {names[id(p)]}) got {rows} "
                    f"per-sample gradient rows for a batch of {size} records: its input does not keep the batch "
                    "in dimension 0; refusing the run"
                )
        G = opacus_flat(params, expected_rows=size)
    for p in params:
        p.grad = None
    return G


def check_per_example_gradients(
    model: torch.nn.Module, named_trainable, dp_opt, *, batches=None, loss=None, collate=None
) -> list[dict]:
    """Compare the active per-example path with a one-record backward on synthetic batches; restore the model.

    Args:
        model: what the run forwards: the peft model (fast path, ``dp_opt.flat`` set) or its Opacus
            ``GradSampleModule``; in train mode, on its device.
        named_trainable: (name, parameter) of every trainable tensor (names for the error).
        dp_opt: the run's :class:`dplora.mechanism.optimizer.UnitDPOptimizer` (only ``flat`` and ``params`` are read:
        no step,
            no noise draw, no accountant step).
        batches: lists of (input_ids, labels) records to check on (tests); None: :func:`synthetic_batches`.
        loss, collate: the step's per-sequence loss ((B, L) batch → (B,) nats) and batch builder, as the step module
            holds them (:func:`dplora.engine.gradcheck.probe_per_sample_gradients` passes its own); None: those of
            :mod:`dplora.engine.batch`.

    Returns:
        One entry per synthetic batch: ``{"records": B, "padded_tokens": L, "max_relative_difference": float,
        "rtol": float, "floor_rel": float}`` (public: synthetic data only). TF32 is off during the check
        (:func:`_tf32_off`); the floor depends on the dtype (:func:`_tolerance`).

    Raises:
        TrainingFailedError: a tensor's per-example rows are not B, or differ from the one-record backward beyond
            the tolerance; the message names the first layer and tensor (exit 4).
    """
    loss = loss or batching.per_sequence_loss
    collate = collate or batching.collate
    flat = getattr(dp_opt, "flat", None)
    params = list(flat.parameters) if flat is not None else list(dp_opt.params)
    names = {id(p): n for n, p in named_trainable}
    for p in params:
        names.setdefault(id(p), f"tensor of shape {tuple(p.shape)}")
    device = params[0].device if params else torch.device("cpu")
    rtol, floor_rel = _tolerance(model)
    saved = _Saved(model)
    report = []
    with _tf32_off():  # the check measures the per-example path, not TF32 rounding (see the module doc)
        try:
            gen = torch.Generator(device="cpu").manual_seed(MASK_SEED)
            with torch.no_grad():
                for p in params:
                    if not bool(p.detach().any()):
                        p.copy_(torch.randn(p.shape, generator=gen, device="cpu").to(p.device, p.dtype) * PERTURB_STD)
            with _held_dropout(model) as held:
                measured = []  # per batch: (B, L, [(record, block differences)]); rows are not kept (memory)
                largest = 0.0  # the largest reference row norm of the whole check: the floor's scale
                for records in batches if batches is not None else synthetic_batches(_vocab_size(model)):
                    batch = collate(records, pad_id=0, device=device)
                    size, width = batch["input_ids"].shape
                    for d in held:
                        d.masks, d.calls, d.row = [], 0, None
                    G = _batched_rows(model, flat, params, names, batch, size, loss)
                    blocks = []
                    for i in range(size):
                        for d in held:
                            d.calls, d.row = 0, i
                        one = {k: v[i : i + 1] for k, v in batch.items()}
                        ref = _plain_reference(model, flat, params, one, loss)
                        blocks.append((i, _differences(G[i], ref, params, i, size, width)))
                        largest = max(largest, float(ref.norm()))
                    measured.append((size, width, blocks))
                    del G
            floor = floor_rel * largest
            for size, width, blocks in measured:
                worst = 0.0
                for i, differences in blocks:
                    worst = max(worst, _judge(differences, params, names, rtol, floor, i, size, width))
                report.append(
                    {
                        "records": size,
                        "padded_tokens": width,
                        "max_relative_difference": worst,
                        "rtol": rtol,
                        "floor_rel": floor_rel,
                    }
                )
        finally:
            saved.restore()
    return report


def _differences(row: torch.Tensor, ref: torch.Tensor, params, i: int, size: int, width: int) -> list[tuple]:
    """Record i's (‖g − r‖₂, ‖r‖₂ + 0.01·‖r_record‖₂) per trainable tensor block, in gradient units (floats).

    Raises:
        TrainingFailedError: the fast row or the reference is non-finite.
    """
    if not (bool(torch.isfinite(row).all()) and bool(torch.isfinite(ref).all())):
        raise TrainingFailedError(
            f"per-example check: non-finite gradient for record {i} of a synthetic batch of {size} records padded "
            f"to {width} tokens; refusing the run"
        )
    scale = 0.01 * float(ref.norm())
    out, offset = [], 0
    for p in params:
        n = p.numel()
        g, r = row[offset : offset + n].double(), ref[offset : offset + n].double()
        offset += n
        out.append((float((g - r).norm()), float(r.norm()) + scale))
    return out


def _judge(differences, params, names, rtol: float, floor: float, i: int, size: int, width: int) -> float:
    """Largest relative difference of record i's blocks; raises naming the first tensor beyond rtol.

    A block passes when ‖g − r‖₂ ≤ rtol·max(‖r‖₂ + 0.01·‖r_record‖₂, floor); ``floor`` (gradient units) is the
    dtype's floor (:data:`FLOOR_REL` in fp32, :data:`FLOOR_REL_HALF` in bf16/fp16; :func:`_tolerance`) times the
    largest reference row norm of the whole check (see the module doc).
    """
    worst = 0.0
    for p, (diff, base) in zip(params, differences, strict=True):
        rel = diff / max(base, floor, 1e-30)
        if not rel <= rtol:  # NaN fails too
            name = names[id(p)]
            raise TrainingFailedError(
                f"per-example check: layer {_layer_of(name)} (tensor {name}) differs from a one-record backward "
                f"(record {i} of a synthetic batch of {size} records padded to {width} tokens: relative difference "
                f"{rel:.3g} > {rtol:g}); the per-example path does not give each record its own gradient "
                "(e.g. a layer that sees (tokens, batch, features)); refusing the run"
            )
        worst = max(worst, rel)
    return worst


def probe_per_sample_gradients(
    model: torch.nn.Module, named_trainable: list[tuple[str, torch.nn.Parameter]], dp_opt=None, *, log=None
) -> list[dict]:
    """Before step 1, on synthetic batches (no private data): every trainable tensor gets a per-sample gradient,
    and (with ``dp_opt``) the active path's per-example rows equal a one-record-at-a-time backward.

    The batch is built on the parameters' device. With the fast path (``dp_opt.flat``) the first check is that every
    LoRA layer wrote its slice of G; with Opacus, that every tensor got ``grad_sample``. The second is
    :func:`dplora.engine.gradcheck.check_per_example_gradients` (a batch with padded length ≠ batch size and one with
    padded length = batch size, both with repeated tokens, and one with no token twice; dropout masks held fixed;
    the model restored exactly; no noise, no accountant step).

    With ``log`` (the run's public log), one line: the check's largest relative difference against its rtol and
    floor (synthetic batches only: public), so the first run on a new device shows the margin.

    Returns:
        The comparison's report per synthetic batch (records, padded tokens, largest relative difference, rtol,
        floor); [] without ``dp_opt``.

    Raises:
        TrainingFailedError: naming the first tensor that got none (cases T2), or the first layer and tensor whose
            per-example gradient differs from the one-record backward.
    """
    device = next((p.device for _, p in named_trainable), torch.device("cpu"))
    batch = batching.collate([([1, 2, 3, 4], [1, 2, 3, 4]), ([5, 6, 7], [5, 6, 7])], pad_id=0, device=device)
    flat = getattr(dp_opt, "flat", None)
    if flat is not None:
        flat.buffer(2)
    batching.per_sequence_loss(model, batch).sum().backward()
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
    report = check_per_example_gradients(
        model, named_trainable, dp_opt, loss=batching.per_sequence_loss, collate=batching.collate
    )
    if log is not None and report:
        log(check_line(report))
    return report


def check_line(report: list[dict]) -> str:
    """The public line of a passed check: its largest relative difference, rtol and floor (synthetic batches)."""
    worst = max(r["max_relative_difference"] for r in report)
    return (
        f"per-example check: largest relative difference {worst:.3g} (rtol {report[0]['rtol']:g}, floor "
        f"{report[0]['floor_rel']:g} of the largest row; {len(report)} synthetic batches, TF32 off)"
    )


def check_all_moved(before: dict[str, torch.Tensor], named_trainable) -> None:
    """Abort naming the first trainable LoRA tensor that did not change (max |Δ| == 0; cases T1).

    Raises:
        TrainingFailedError: a tensor did not move.
    """
    for name, p in named_trainable:
        if float((p.detach() - before[name]).abs().max()) == 0.0:
            raise TrainingFailedError(f"trainable tensor {name} did not change after the first step")
