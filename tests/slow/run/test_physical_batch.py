"""The slow tier of tests/run/test_physical_batch.py, whose docstring describes the module."""

from __future__ import annotations

import pytest
import torch
from support.physical_batch import PAD, OOMAbove, engine, shared_model

from dplora.engine import membatch

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


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
