"""The process's runtime: CPU threads free for a run and the device the trainable tensors live on."""

from __future__ import annotations

import os

import torch


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


def memory_kind(device) -> str:
    """What :func:`peak_memory_gib` measures on ``device``, in words."""
    return "torch.cuda.max_memory_allocated" if device.type == "cuda" else "process peak RSS"


def reset_peak_memory(device) -> None:
    """Start the peak of :func:`peak_memory_gib` anew on CUDA (``torch.cuda.reset_peak_memory_stats``), right before
    step 1, so the reported peak is the training's and not the set-up's (the ``physical_batch_size: auto`` probe's
    64-record try, the time estimate's synthetic step, the model build). On CPU nothing: the peak RSS of a process
    cannot be reset (``getrusage``), so it still counts the set-up.

    Args:
        device: the run's ``torch.device``.
    Raises:
        Nothing of its own (a CUDA error of torch passes through).
    """
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device) -> float:
    """Peak memory of this process in GiB: ``torch.cuda.max_memory_allocated`` on CUDA (since
    :func:`reset_peak_memory`, before step 1), peak RSS on CPU (the process's, set-up included)."""
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB
