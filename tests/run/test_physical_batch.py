"""``training.physical_batch_size: auto`` and the out-of-memory retry (issue 27.2), with simulated OOM errors.

A forward pre-hook raises ``torch.OutOfMemoryError`` when a physical batch has more than k records (or once, on a
chosen forward, after earlier physical batches of the step already filled the per-unit sum). The privatisation is
patched to add a FIXED noise vector and record its input, so a run with OOM retries and one without can be compared
exactly: the same units, the same clipped sum, one noise draw and one accountant step per logical step.
"""

from __future__ import annotations

import io
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import contract_dict
from support.physical_batch import IGNORE, PAD, PLAN, OOMAbove, engine, shared_model

from dplora.contract.loader import parse_contract
from dplora.engine import distributed, membatch
from dplora.mechanism import sampling
from dplora.run import loop
from dplora.run.execution import memory_entry

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


RECORDS = [
    ([1, 2, 3, 4, 5], [IGNORE, IGNORE, 3, 4, 5]),
    ([6, 7, 8], [6, 7, 8]),
    ([9, 10, 11, 12, 13, 14, 15], [9, 10, 11, 12, 13, 14, 15]),
    ([20, 21], [20, 21]),
    ([30, 31, 32], [30, 31, 32]),
    ([50, 51, 52, 53, 54, 55], [IGNORE, 51, 52, 53, 54, 55]),
    ([60, 61, 62], [60, 61, 62]),
    ([70, 71, 72, 73, 74], [70, 71, 72, 73, 74]),
    ([80, 81, 82, 83], [IGNORE, IGNORE, 82, 83]),
]


UNITS = [[0, 1], [2, 3, 4], [5], [6, 7, 8]]  # records of each protected unit


STEP_UNITS = [np.array([0, 1, 3]), np.array([1, 2]), np.array([0, 1, 2, 3])]  # the "Poisson" sample of each step


REAL_PHYSICAL_BATCHES = loop._physical_batches


def _run(monkeypatch, hook: OOMAbove | None, physical: int = 4, per_sample: str = "fast"):
    """Three logical steps through loop.run_steps over STEP_UNITS; returns what the test compares."""
    model = shared_model()
    noise = torch.randn(sum(p.numel() for p in model.parameters() if p.requires_grad), generator=torch.Generator())
    noise = noise * 0 + torch.linspace(-0.1, 0.1, noise.numel())  # fixed, the same in every run
    wrapped, dp_opt, accountant, named, sums = engine(model, monkeypatch, noise, per_sample)
    if hook is not None:
        model.base_model.model.register_forward_pre_hook(hook, with_kwargs=True)
    samples, attempts = [], []

    class FixedSampler:
        def __init__(self, num_units, rate):
            pass

        def sample(self):
            samples.append(STEP_UNITS[len(samples)])
            return samples[-1]

    def spy(spec, state, units, rows, local, weight, physical):
        attempts.append((len(samples), list(units), list(rows), physical))
        return REAL_PHYSICAL_BATCHES(spec, state, units, rows, local, weight, physical)

    monkeypatch.setattr(sampling, "PoissonUnitSampler", FixedSampler)
    monkeypatch.setattr(loop, "_physical_batches", spy)
    spec = types.SimpleNamespace(
        plan=PLAN,
        unit_index=types.SimpleNamespace(num_units=len(UNITS), records_of_unit=UNITS),
        examples=RECORDS,
        pad_id=PAD,
        device=torch.device("cpu"),
        physical_batch_size=physical,
        world=distributed.SINGLE,
        config=types.SimpleNamespace(sharded_base=False),
        # private=False only skips the step-1 "every tensor moved" check; the sampler is the mechanism's
        mechanism=types.SimpleNamespace(
            private=False, sampler=lambda n: sampling.unit_sampler(n, PLAN.sample_rate, distributed.SINGLE)
        ),
    )
    state = loop.RunState(model=wrapped, optimizer=dp_opt, accountant=accountant, named=named)
    progress = types.SimpleNamespace(update=lambda *a: None)
    loop.run_steps(spec, state, metrics=io.StringIO(), progress=progress)
    params = torch.cat([p.detach().flatten() for _, p in named])
    return {"samples": len(samples), "attempts": attempts, "sums": sums, "params": params, "state": state}


def test_mid_run_oom_retries_the_same_units_once_noised_and_accounted(monkeypatch):
    """OOM on every physical batch > 2 records: each step re-runs the same units at 2, with the same clipped sum,
    one noise draw and one accountant step; the trained parameters equal the no-OOM run's."""
    clean = _run(monkeypatch, None)
    hook = OOMAbove(k=2)
    oom = _run(monkeypatch, hook)
    assert clean["samples"] == oom["samples"] == 3  # one Poisson sample per logical step
    assert [a[3] for a in clean["attempts"]] == [4, 4, 4]
    assert [(a[0], a[3]) for a in oom["attempts"]] == [(1, 4), (1, 2), (2, 2), (3, 2)]  # halved once, kept
    first, retry = oom["attempts"][0], oom["attempts"][1]
    assert first[1] == retry[1] == [0, 1, 3] and first[2] == retry[2] == [
        0,
        1,
        2,
        3,
        4,
        6,
        7,
        8,
    ]  # same unit and row ids
    assert [a[1:3] for a in oom["attempts"][1:]] == [a[1:3] for a in clean["attempts"]]
    assert len(clean["sums"]) == len(oom["sums"]) == 3  # noise added once per logical step
    for a, b in zip(clean["sums"], oom["sums"], strict=True):
        assert float(a.abs().max()) > 0 and float((a - b).abs().max()) < 1e-6
    assert clean["state"].accountant.steps == oom["state"].accountant.steps == 3
    assert oom["state"].oom_retries == 1 and oom["state"].physical_batch == 2 and max(hook.sizes[1:]) <= 2
    assert float((clean["params"] - oom["params"]).abs().max()) < 1e-6


def test_oom_after_a_partial_step_rebuilds_the_unit_sum_from_zero(monkeypatch):
    """The second physical batch of step 1 runs out of memory after the first filled part of the per-unit sum:
    the retry starts from an empty sum (no unit counted twice), and nothing else changes."""
    clean = _run(monkeypatch, None, physical=2)
    oom = _run(monkeypatch, OOMAbove(once_at=2), physical=2)
    assert [(a[0], a[3]) for a in oom["attempts"]] == [(1, 2), (1, 1), (2, 1), (3, 1)]
    assert oom["attempts"][0][1:3] == oom["attempts"][1][1:3] == clean["attempts"][0][1:3]
    for a, b in zip(clean["sums"], oom["sums"], strict=True):
        assert float((a - b).abs().max()) < 1e-6
    assert oom["state"].accountant.steps == 3 and len(oom["sums"]) == 3


def test_oom_with_one_record_per_forward_is_raised(monkeypatch):
    with pytest.raises(torch.OutOfMemoryError):
        _run(monkeypatch, OOMAbove(k=0), physical=2)


def test_the_opacus_path_does_not_retry_and_refuses_auto(monkeypatch):
    """Opacus hooks count forwards per parameter, so an out-of-memory error mid-model cannot be undone: the error
    is raised (the run's resumable exit 4) after no noise and no accountant step, and `auto` is refused there."""
    hook = OOMAbove(k=2)
    with pytest.raises(torch.OutOfMemoryError):
        _run(monkeypatch, hook, per_sample="opacus")
    assert hook.sizes == [4]  # one attempt, no retry at a smaller batch
    raw = contract_dict(
        Path("m"), Path("d.csv"), Path("o"), privacy={"per_sample": "opacus"}, training={"physical_batch_size": "auto"}
    )
    with pytest.raises(Exception, match="physical_batch_size=auto needs privacy.per_sample=fast"):
        parse_contract(raw)


def test_probe_frees_the_largest_tries_gradient_buffer(monkeypatch):
    """The fast path's (B, P) storage only grows; after the probe settles on 4 records it no longer holds the
    64-row try: it is freed, and the first step allocates 4 rows. On main it stayed (64, P) for the whole run
    (10.7 GB dead on Llama-3.1-8B at 8 of 64 rows). The OOM retry frees it the same way."""
    model = shared_model()
    wrapped, dp_opt, _, named, _ = engine(model, monkeypatch, 0.0)
    flat = dp_opt.flat
    rows = []
    arm = flat.buffer
    monkeypatch.setattr(flat, "buffer", lambda b: rows.append(b) or arm(b))
    model.base_model.model.register_forward_pre_hook(OOMAbove(k=5), with_kwargs=True)
    kw = {"max_seq_len": 12, "pad_id": PAD, "device": torch.device("cpu")}
    assert membatch.probe_physical_batch(wrapped, dp_opt, named, **kw, cap=64, probe_cpu=True) == 4
    assert rows == [64, 32, 16, 8, 4]  # every try armed its rows (the 64-row one first)
    assert flat._storage is None and flat._armed is None
    assert tuple(flat.buffer(4).shape) == (4, flat.P) and tuple(flat._storage.shape) == (4, flat.P)
    membatch.reset_after_oom(wrapped, dp_opt, named)  # the loop's OOM retry
    assert flat._storage is None


def _config(contract):
    """The run's compiled settings for ``contract`` (the plan is not read by the memory entry)."""
    from dplora.recipe.config import RunOptions, compile_run

    return compile_run(contract, PLAN, RunOptions())


def test_auto_is_recorded_under_execution_and_other_values_are_refused():
    raw = contract_dict(Path("/m"), Path("d.csv"), Path("out"))
    raw["training"]["physical_batch_size"] = "auto"
    contract = parse_contract(raw)
    assert contract.training.fixed_physical_batch_size == 8
    spec = types.SimpleNamespace(
        config=_config(contract), device=torch.device("cuda"), physical_batch_size=16, attn_implementation="sdpa"
    )  # the default `auto`, resolved at load (issue 42.2)
    entry = memory_entry(spec)
    assert entry["physical_batch_size"] == 16 and entry["physical_batch_source"].startswith("auto: probed")
    assert entry["gradient_checkpointing"] == "off" and entry["attn_implementation"] == "sdpa"
    raw["training"]["physical_batch_size"] = 6
    raw["training"]["gradient_checkpointing"] = True
    raw["model"]["attn_implementation"] = "eager"
    entry = memory_entry(
        types.SimpleNamespace(config=_config(parse_contract(raw)), device=torch.device("cpu"), physical_batch_size=6)
    )
    assert entry == {
        "attn_implementation": "eager",
        "gradient_checkpointing": "non-reentrant",
        "physical_batch_size": 6,
        "physical_batch_source": "contract",
    }
    from dplora.errors import BadInputError

    for bad in ("Auto", "big", 0):
        raw["training"]["physical_batch_size"] = bad
        with pytest.raises(BadInputError, match="physical_batch_size"):
            parse_contract(raw)
