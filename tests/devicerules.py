"""CUDA's device-mixing rules on a CPU-only machine: a test harness.

CI has no GPU, yet the worst GPU fault dplora has had (a probe batch built on the CPU while the model sat on
``cuda:0``) is a rule violation that needs no GPU to see. :class:`CudaRules` keeps every number on the CPU but
tags the storages that would live on CUDA, and applies CUDA's rules to every aten op (autograd's backward included):

* a tensor is CUDA when it was created with ``device="cuda"`` (any factory, ``new_*``, ``*_like``), moved with
  ``.to("cuda")``/``.cuda()``/``Module.to``, or computed from a CUDA tensor; HOST when a Python call created it
  without a CUDA device (``torch.tensor``, ``torch.full(..., device="cpu")``, ``from_numpy``, ``.cpu()``);
* an op that takes a CUDA tensor and a HOST tensor of one or more dimensions raises ``DeviceMixError`` with
  CUDA's own message; a 0-dim HOST tensor may mix (CUDA accepts CPU scalars), and so may HOST index tensors in
  ``aten.index``/``index_put_`` and either side of ``copy_`` (both legal on CUDA);
* tensors that aten creates itself with no tensor input (a backward formula's ``at::zeros``) carry no tag and mix
  with either side: on a GPU they land on the device of the tensors they are made for.

While it runs, ``torch.cuda.is_available()`` is true, ``Tensor.device`` reports ``cuda:0`` for CUDA-tagged
tensors (so code that writes ``device=x.device`` asks for CUDA, as it would there) and the ``torch.cuda`` memory
calls are no-ops, so dplora's device selection picks ``cuda:0`` while the numbers stay on the CPU. Inside an op's
own Python kernel (bitsandbytes' CPU ops) tensors show their real device, so the kernel computes where it runs.

Tensors made before the rules start carry no tag: build the model and data inside. ``untagged_mixes`` counts the
ops where a CUDA tensor met an untagged non-scalar one; a test that wants no blind spot asserts it is empty.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import weakref

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

CUDA, HOST = "cuda", "host"
_IMPORT_FIRST = ("bitsandbytes", "peft", "transformers", "opacus")
FAKE_DEVICE = torch.device("cuda", 0)
_REAL_DEVICE = torch._C.TensorBase.device  # the C property; Tensor.device is shadowed while the rules run
_REAL_IS_CUDA = torch._C.TensorBase.is_cuda
_REAL_GENERATOR = torch.Generator
# Ops where CUDA itself accepts a CPU tensor beside a CUDA one.
_COPY_OPS = {torch.ops.aten.copy_.default, torch.ops.aten.copy.default, torch.ops.aten._copy_from.default}
_INDEX_OPS = {
    torch.ops.aten.index.Tensor,
    torch.ops.aten.index_put_.default,
    torch.ops.aten.index_put.default,
    torch.ops.aten._index_put_impl_.default,
}


class DeviceMixError(RuntimeError):
    """An op mixed a CUDA tensor and a CPU tensor in a way CUDA refuses."""


def _is_cuda(device) -> bool:
    if device is None or isinstance(device, (torch.Tensor, bool)):
        return False
    if isinstance(device, int):
        return True  # an ordinal names a CUDA device (``x.to(0)``)
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


class _GeneratorMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, _REAL_GENERATOR)


class _Generator(metaclass=_GeneratorMeta):
    """``torch.Generator(device="cuda")`` on a CPU build: a CPU generator (the draws stay on the CPU)."""

    def __new__(cls, device="cpu"):
        return _REAL_GENERATOR(device="cpu" if _is_cuda(device) else device)


class CudaRules:
    """Context manager: run code as if on ``cuda:0`` and raise on the first CUDA/CPU mix (see the module doc).

    ``transfers`` counts the explicit host → device moves (``.to``/``.cuda``), ``checked`` the ops seen,
    ``untagged_mixes`` the ops (by name) where a CUDA tensor met a non-scalar tensor with no tag: a hole in the check,
    which a test can require to be empty."""

    def __init__(self):
        self.tags: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.transfers = 0
        self.checked = 0
        self.seen: set[str] = set()  # op namespaces seen ("aten", "bitsandbytes", ...)
        self.untagged_mixes: collections.Counter = collections.Counter()  # CUDA beside a tensor aten made itself
        self.in_kernel = 0  # inside an op's own (Python) kernel, as bitsandbytes' CPU ops: the real device shows
        self._stack: contextlib.ExitStack | None = None

    # -- tags ----------------------------------------------------------------------------------------------------
    def tag_of(self, t: torch.Tensor) -> str | None:
        try:
            return self.tags.get(t.untyped_storage())
        except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, meta)
            return None

    def tag(self, tree, kind: str) -> None:
        for t in _tensors(tree):
            with contextlib.suppress(RuntimeError, NotImplementedError):
                self.tags[t.untyped_storage()] = kind

    def is_cuda(self, t: torch.Tensor) -> bool:
        return self.tag_of(t) == CUDA

    # -- patches -------------------------------------------------------------------------------------------------
    def __enter__(self):
        for name in _IMPORT_FIRST:  # libraries that probe CUDA at import would find the fake one and fail
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        rules = self
        stack = contextlib.ExitStack()
        patch = _undoable_setattr(stack)

        def device(self):
            if rules.in_kernel or not rules.is_cuda(self):
                return _REAL_DEVICE.__get__(self)
            return FAKE_DEVICE

        def is_cuda(self):
            return not rules.in_kernel and rules.is_cuda(self)

        patch(torch.Tensor, "device", property(device))
        patch(torch.Tensor, "is_cuda", property(is_cuda))
        patch(torch, "Generator", _Generator)
        # aten factories asked for "cuda" reach the dispatch mode, which makes them on the CPU; only the lazy CUDA
        # init before dispatch stands in the way
        patch(torch.cuda, "_lazy_init", lambda: None)
        for name in ("tensor", "as_tensor"):  # these fail before dispatch on a CPU build, even inside other ops
            patch(torch, name, _cuda_factory(getattr(torch, name), self))
        cuda = torch.cuda
        for name, value in {
            "is_available": lambda: True,
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "is_bf16_supported": lambda *a, **k: True,
            "get_device_capability": lambda *a, **k: (9, 0),
            "get_device_name": lambda *a, **k: "CudaRules (CPU)",
            "synchronize": lambda *a, **k: None,
            "empty_cache": lambda *a, **k: None,
            "reset_peak_memory_stats": lambda *a, **k: None,
            "max_memory_allocated": lambda *a, **k: 0,
            "memory_allocated": lambda *a, **k: 0,
            "memory_reserved": lambda *a, **k: 0,
            "max_memory_reserved": lambda *a, **k: 0,
            "mem_get_info": lambda *a, **k: (80 * 2**30, 80 * 2**30),
        }.items():
            patch(cuda, name, value)
        # a run on "cuda" sets TF32 (it changes torch's global fp32 matmul precision too): later tests keep theirs
        flags = (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision(),
        )
        stack.callback(_restore_tf32, *flags)
        stack.enter_context(_Front(self))
        stack.enter_context(_Rules(self))
        self._stack = stack
        return self

    def __exit__(self, *exc):
        stack, self._stack = self._stack, None
        return stack.__exit__(*exc)


def _restore_tf32(matmul: bool, cudnn: bool, precision: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn
    torch.set_float32_matmul_precision(precision)


def _undoable_setattr(stack: contextlib.ExitStack):
    """``setattr`` undone by ``stack`` (no pytest fixture needed, so the rules nest inside any test)."""
    missing = object()

    def patch(owner, name, value):
        old = owner.__dict__.get(name, missing) if isinstance(owner, type) else getattr(owner, name, missing)

        def undo():
            if old is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, old)

        setattr(owner, name, value)
        stack.callback(undo)

    return patch


def _cuda_factory(real, rules: CudaRules):
    def factory(*args, **kwargs):
        if not _is_cuda(kwargs.get("device")):
            return real(*args, **kwargs)
        kwargs["device"] = "cpu"
        out = real(*args, **kwargs)
        if any(isinstance(a, torch.Tensor) and a.untyped_storage() is out.untyped_storage() for a in args):
            out = out.clone()  # as_tensor(cpu_tensor, device="cuda") copies on CUDA
        rules.tag(out, CUDA)
        return out

    return factory


_TO = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu}


class _Front(TorchFunctionMode):
    """The Python front: turns CUDA device requests into CPU calls and tags what they create."""

    def __init__(self, rules: CudaRules):
        super().__init__()
        self.rules = rules

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _TO:
            return self._move(func, args, kwargs)
        if func is torch._C._nn._parse_to:  # Module.to parses its device here: it must stay "cuda"
            return func(*args, **kwargs)
        want = kwargs.get("device")
        if "device" in kwargs and _is_cuda(want):
            kwargs["device"] = "cpu"
        inputs = _tensors((args, kwargs))
        out = func(*args, **kwargs)
        if "device" in kwargs and want is not None:
            if _is_cuda(want):
                mine = {id(t.untyped_storage()) for t in inputs if not self.rules.is_cuda(t)}
                if any(id(t.untyped_storage()) in mine for t in _tensors(out)):
                    out = pytree.tree_map_only(torch.Tensor, torch.clone, out)  # as_tensor(cpu_t, device="cuda")
                self.rules.tag(out, CUDA)
            elif not any(self.rules.is_cuda(t) for t in _tensors(out)):
                self.rules.tag(out, HOST)
        elif not inputs and isinstance(out, torch.Tensor):
            self.rules.tag(out, HOST)  # a Python factory without a device: the CPU
        return out

    def _move(self, func, args, kwargs):
        self_, rest = args[0], args[1:]
        if func is torch.Tensor.cuda:
            device, dtype, non_blocking, memory_format = FAKE_DEVICE, None, kwargs.get("non_blocking", False), None
        elif func is torch.Tensor.cpu:
            device, dtype, non_blocking, memory_format = torch.device("cpu"), None, False, None
        elif rest and isinstance(rest[0], torch.Tensor):
            other = rest[0]
            device, dtype = (FAKE_DEVICE if self.rules.is_cuda(other) else torch.device("cpu")), other.dtype
            non_blocking, memory_format = kwargs.get("non_blocking", False), None
        else:
            cpu = torch.device("cpu")
            clean = [cpu if _is_cuda(a) else a for a in rest]
            ckw = {k: (cpu if k == "device" and _is_cuda(v) else v) for k, v in kwargs.items() if k != "copy"}
            device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*clean, **ckw)
            if _is_cuda(kwargs.get("device")) or any(_is_cuda(a) for a in rest):
                device = FAKE_DEVICE
        copy = kwargs.get("copy", False)
        src_cuda = self.rules.is_cuda(self_)
        to_kw = {"dtype": dtype, "non_blocking": non_blocking, "copy": copy}
        if memory_format is not None:
            to_kw["memory_format"] = memory_format
        if device is None or (device.type == "cuda") == src_cuda:
            return torch.Tensor.to(self_, **to_kw)  # same side: no move (dtype only, or already there)
        to_kw["copy"] = True
        out = torch.Tensor.to(self_, "cpu", **to_kw)
        if device.type == "cuda":
            self.rules.transfers += 1
            self.rules.tag(out, CUDA)
        else:
            self.rules.tag(out, HOST)
        return out


class _Rules(TorchDispatchMode):
    """The aten level: CUDA's mixing rules on every op, and the CUDA tag carried from inputs to outputs."""

    def __init__(self, rules: CudaRules):
        super().__init__()
        self.rules = rules

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rules = self.rules
        rules.checked += 1
        rules.seen.add(func.namespace)
        cuda, host, host_scalar, untagged, loose = [], [], False, False, False
        if func in _INDEX_OPS:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            skip = {id(t) for t in _tensors(indices)}
        else:
            skip = set()
        for t in _tensors((args, kwargs)):
            kind = rules.tag_of(t)
            if kind == CUDA:
                cuda.append(t)
            elif kind == HOST and id(t) not in skip:
                if t.dim() == 0:
                    host_scalar = True
                else:
                    host.append(t)
            elif kind is None:
                untagged = True
                loose = loose or t.dim() > 0
        if cuda and loose:
            rules.untagged_mixes[str(func)] += 1
        if cuda and host and func not in _COPY_OPS:
            raise DeviceMixError(
                f"Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
                f"(CudaRules: {func} got a CPU tensor of shape {tuple(host[0].shape)} beside a CUDA tensor of shape "
                f"{tuple(cuda[0].shape)})"
            )
        factory = _is_cuda(kwargs.get("device"))
        if factory:
            kwargs = {**kwargs, "device": torch.device("cpu")}
        rules.in_kernel += 1
        try:
            out = func(*args, **kwargs)
        finally:
            rules.in_kernel -= 1
        if factory:
            rules.tag(out, CUDA)
            return out
        if func in _COPY_OPS:
            return out  # the destination keeps its side
        if cuda:
            rules.tag(out, CUDA)
        elif host or (host_scalar and not untagged):
            fresh = [t for t in _tensors(out) if rules.tag_of(t) is None]
            rules.tag(fresh, HOST)
        return out
