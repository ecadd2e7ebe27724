"""scripts/bench_scale.py's largest-batch search (issue 47): it doubles from the batch the timed steps just ran
(never running that batch again), stops at the first out-of-memory, and reports ``≥cap`` when every size fits; and
its build: in bf16 (no fp32 copy of the base), once per variant and mode for every sequence length and batch."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


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
def test_largest_batch_doubles_from_the_timed_batch_and_stops_at_oom(fits, cap, limit, tried, answer):
    bench = _bench_scale()
    ran = []

    def measure(batch):
        ran.append(batch)
        if batch > limit:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {}

    assert bench._largest_batch(measure, fits, cap) == answer
    assert ran == tried


def test_an_error_that_is_not_out_of_memory_is_raised():
    bench = _bench_scale()

    def measure(batch):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        bench._largest_batch(measure, 2, 64)


def test_one_bf16_build_per_variant_and_mode_for_every_seq_and_batch(monkeypatch, tmp_path):
    """The toy shape at two sequence lengths with the largest-batch search: 2 modes → 2 builds (not one per seq,
    batch and search step), each born in bf16 with fp32 LoRA, and a row for each seq and mode."""
    import torch

    bench = _bench_scale()
    built = []
    real_build = bench.build

    def build(arch, variant, dtype, device):
        model = real_build(arch, variant, dtype, device)
        built.append({p.dtype for n, p in model.named_parameters() if "lora_" not in n})
        assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
        return model

    monkeypatch.setattr(bench, "build", build)
    out = tmp_path / "scale"
    argv = ["bench_scale.py", "--arch", "toy", "--device", "cpu", "--seqs", "16", "32", "--batch", "2"]
    argv += ["--max-batch", "8", "--steps", "1", "--warmup", "0", "--variants", "plain", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    assert bench.main() == 0
    assert built == [{torch.bfloat16}, {torch.bfloat16}]
    assert torch.get_default_dtype() == torch.float32  # restored after each build
    rows = __import__("json").loads((out / "scale.json").read_text())["rows"]
    assert sorted((r["seq"], r["mode"]) for r in rows) == [
        (16, "dplora_fast"),
        (16, "non_dp"),
        (32, "dplora_fast"),
        (32, "non_dp"),
    ]
    assert all(r["largest_batch"] == "≥8" for r in rows), rows
