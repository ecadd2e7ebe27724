"""scripts/bench_scale.py's largest-batch search (issue 47): it doubles from the batch the timed steps just ran
(never running that batch again), stops at the first out-of-memory, and reports ``≥cap`` when every size fits."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench_scale():
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "scripts" / "bench_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("fits", "cap", "limit", "tried", "answer"),
    [
        (2, 64, 16, [4, 8, 16, 32], "16"),  # 32 runs out of memory: 16 is the largest
        (8, 64, 1000, [16, 32, 64], "≥64"),  # every size up to the cap fits
        (2, 2, 1000, [], "≥2"),  # the cap is the timed batch: nothing more is run
        (8, 4, 1000, [], "≥8"),  # a timed batch over the cap: it fits, nothing more is run
        (4, 64, 4, [8], "4"),  # the first doubling runs out of memory
    ],
)
def test_largest_batch_doubles_from_the_timed_batch_and_stops_at_oom(monkeypatch, fits, cap, limit, tried, answer):
    bench = _bench_scale()
    ran = []

    def one(arch, variant, mode, batch, seq, dtype, device, steps, warmup):
        ran.append(batch)
        if batch > limit:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {}

    monkeypatch.setattr(bench, "_one", one)
    assert bench._largest_batch("toy", "plain", "non_dp", fits, cap, 16, None, "cpu") == answer
    assert ran == tried


def test_an_error_that_is_not_out_of_memory_is_raised(monkeypatch):
    bench = _bench_scale()

    def one(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(bench, "_one", one)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        bench._largest_batch("toy", "plain", "non_dp", 2, 64, 16, None, "cpu")
