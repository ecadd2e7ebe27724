"""The peak memory a run reports is its steps', not its set-up's: the CUDA peak is reset right before step 1.

The ``physical_batch_size: auto`` probe tries 64 records first and the time estimate runs a synthetic step; on main
``torch.cuda.max_memory_allocated`` after the run was the probe's peak. CI has no GPU: the reset is checked through
its seam (:func:`dplora.engine.runtime.reset_peak_memory`) on a faked CUDA device, and its place in a real run.
"""

from __future__ import annotations

import pytest
import torch
from conftest import contract_dict

from dplora.contract.loader import parse_contract
from dplora.engine import gradcheck, runtime
from dplora.recipe.config import RunOptions
from dplora.recipe.train import run_training
from dplora.run import checkpoint

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


def test_reset_peak_memory_resets_cuda_and_leaves_cpu(monkeypatch):
    """On a CUDA device the seam calls ``torch.cuda.reset_peak_memory_stats(device)``; on CPU nothing (peak RSS
    cannot be reset)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(device))
    runtime.reset_peak_memory(torch.device("cpu"))
    assert calls == []
    runtime.reset_peak_memory(torch.device("cuda", 0))
    assert calls == [torch.device("cuda", 0)]


def test_peak_is_reset_after_the_setup_probes_and_before_step_1(
    tmp_path, tiny_model_dir, tickets_csv, signing_key, monkeypatch
):
    """A real run: the per-example check (set-up), then one reset on the run's device, then the steps (step 0
    when the reset happens), then the peak is read at publish."""
    events = []
    probe, peak = gradcheck.probe_per_sample_gradients, runtime.peak_memory_gib

    def spy_probe(*args, **kwargs):
        events.append("per-example check")
        return probe(*args, **kwargs)

    def spy_steps(point, step):
        if point == "loop-start":  # right before run_steps
            events.append(f"steps from {step}")

    def spy_peak(device):
        events.append("peak read")
        return peak(device)

    monkeypatch.setattr(gradcheck, "probe_per_sample_gradients", spy_probe)
    monkeypatch.setattr(runtime, "reset_peak_memory", lambda device: events.append(f"reset on {device}"))
    monkeypatch.setattr(runtime, "peak_memory_gib", spy_peak)
    raw = contract_dict(tiny_model_dir, tickets_csv, tmp_path / "run", training={"steps": 2})
    with checkpoint.fault_hook(spy_steps):
        result = run_training(
            parse_contract(raw),
            RunOptions(signing_key=signing_key[0], data_key=None, progress=False, threads=1),
            log=lambda *_: None,
        )
    assert result.steps_done == 2
    assert events == ["per-example check", "reset on cpu", "steps from 0", "peak read"]
