"""Issue 42.7: the time estimate before step 1 is public by construction: the plan's public numbers, public contract
keys and a timed synthetic step; never a count of the private data."""

from __future__ import annotations

import inspect
import types

import pytest

from dplora.plan import estimate as est

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


def _inputs(**kw):
    base = {
        "steps": 20,
        "expected_batch_size": 32.0,
        "records_per_unit": 1,
        "records_basis": "row",
        "world_size": 1,
        "physical_batch": 8,
        "max_seq_len": 64,
        "probe_seconds": 0.5,
        "device": "cpu",
    }
    return est.EstimateInputs(**(base | kw))


@pytest.mark.parametrize(
    ("kw", "forwards", "seconds"),
    [
        ({}, 4, 40.0),  # 20 steps × ⌈32/8⌉ × 0.5 s
        ({"expected_batch_size": 33.0}, 5, 50.0),  # ⌈33/8⌉ = 5
        ({"expected_batch_size": 8.0, "records_per_unit": 3, "records_basis": "cap"}, 3, 30.0),
        ({"world_size": 2}, 2, 20.0),  # each process runs half the expected units
        ({"expected_batch_size": 2.0}, 1, 10.0),  # at least one forward per step
        ({"steps": 0}, 4, 0.0),
    ],
)
def test_the_estimate_is_t_times_forwards_times_the_probe(kw, forwards, seconds):
    inputs = _inputs(**kw)
    assert est.forwards_per_step(inputs) == forwards
    assert est.estimate_seconds(inputs) == pytest.approx(seconds)
    assert est.estimate_doc(inputs)["seconds"] == pytest.approx(seconds)


def test_duration_text():
    assert [est.duration_text(s) for s in (40, 89, 600, 5340, 5400, 12000)] == [
        "40 s", "89 s", "10 min", "89 min", "1 h 30 min", "3 h 20 min",
    ]  # fmt: skip


def test_the_inputs_function_takes_no_data():
    """Its parameters are the contract, the plan and probe facts: no table, unit index, examples or counts."""
    assert list(inspect.signature(est.estimate_inputs).parameters) == [
        "contract", "plan", "physical_batch", "probe_seconds", "device", "world_size", "done_steps",
    ]  # fmt: skip
    contract = types.SimpleNamespace(
        privacy=types.SimpleNamespace(max_records_per_unit=None, protected_unit="row"),
        training=types.SimpleNamespace(max_seq_len=48),
    )
    plan = types.SimpleNamespace(steps=5, expected_batch_size=8)
    got = est.estimate_inputs(contract, plan, physical_batch=4, probe_seconds=0.2, device="cpu", done_steps=2)
    assert got == _inputs(steps=3, expected_batch_size=8.0, physical_batch=4, max_seq_len=48, probe_seconds=0.2)
    contract.privacy.protected_unit = "user"
    got = est.estimate_inputs(contract, plan, physical_batch=4, probe_seconds=0.2, device="cpu")
    assert (got.records_per_unit, got.records_basis) == (1, "assumed")
    assert "1 record per unit assumed (a unit's record count is private" in est.estimate_line(got)
    contract.privacy.max_records_per_unit = 5
    got = est.estimate_inputs(contract, plan, physical_batch=4, probe_seconds=0.2, device="cpu")
    assert (got.records_per_unit, got.records_basis, est.forwards_per_step(got)) == (5, "cap", 10)  # ⌈8·5/4⌉
