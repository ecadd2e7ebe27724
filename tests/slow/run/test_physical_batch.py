"""``training.physical_batch_size: auto`` and the out-of-memory retry (issue 27.2), with simulated OOM errors.

A forward pre-hook raises ``torch.OutOfMemoryError`` when a physical batch has more than k records (or once, on a
chosen forward, after earlier physical batches of the step already filled the per-unit sum). The privatisation is
patched to add a FIXED noise vector and record its input, so a run with OOM retries and one without can be compared
exactly: the same units, the same clipped sum, one noise draw and one accountant step per logical step.
"""

from __future__ import annotations

import types

import pytest
import torch
from support.physical_batch import OOMAbove, engine, shared_model

from dplora.engine import batch as batching
from dplora.engine import membatch

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


PAD, IGNORE = 256, batching.IGNORE_INDEX


PLAN = types.SimpleNamespace(
    noise_multiplier=1.0, max_grad_norm=0.5, expected_batch_size=2.0, sample_rate=0.5, steps=3, target_epsilon=10.0
)


PLAN.epsilon_at = lambda step: 0.1 * step


def test_auto_probe_picks_at_most_k_on_synthetic_batches_without_noise_or_accounting(monkeypatch):
    model = shared_model()
    wrapped, dp_opt, accountant, named, sums = engine(model, monkeypatch, 0.0)
    before = [p.detach().clone() for _, p in named]
    hook = OOMAbove(k=5)
    model.base_model.model.register_forward_pre_hook(hook, with_kwargs=True)
    seen = []
    model.base_model.model.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw["input_ids"].clone()), with_kwargs=True, prepend=True
    )
    kw = {"max_seq_len": 12, "pad_id": PAD, "device": torch.device("cpu")}
    assert membatch.probe_physical_batch(wrapped, dp_opt, named, **kw) == membatch.CPU_DEFAULT == 8
    assert hook.sizes == []  # CPU: the fixed default, no forward
    chosen = membatch.probe_physical_batch(wrapped, dp_opt, named, **kw, cap=64, probe_cpu=True)
    assert chosen == 4 <= hook.k
    assert hook.sizes == [64, 32, 16, 8, 4]
    assert all(t.shape[1] == 12 and bool((t == 1).all()) for t in seen)  # synthetic tokens, never a record
    assert sums == [] and accountant.steps == 0  # no noise, no accountant step
    assert all(p.grad is None for _, p in named) and dp_opt.flat._armed is None
    assert all(bool((p.detach() == b).all()) for (_, p), b in zip(named, before, strict=True))
    # the run goes on normally afterwards: the per-unit sum starts empty
    total, norms = dp_opt.accumulator.finish()
    assert float(total.abs().max()) == 0.0 and len(norms) == 0
