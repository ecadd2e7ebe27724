"""Cost of dplora's cryptographic noise per logical step at 0.5M, 5M and 40M LoRA parameters (one run, ~1 min).

For each size P it times, on the chosen device: the ChaCha20 keystream alone (32 bytes per value), one full
:meth:`dplora.mechanism.noise.CsprngGaussian.normal` draw (stream + copy + fp64 Box–Muller, 4 draws summed, → fp32),
torch's
non-cryptographic ``torch.normal`` (the old generator) for comparison, and a rough step time: one AdamW update
of P fp32 parameters plus a (B, min(P, 5M)) per-sample gradient clip-and-sum with B = 8 (a lower bound on a real
step, which also runs the base model's forward and backward). Prints one table; ``--json PATH`` also writes its rows.

It first compares the two keystream generators on CPU in the same run (issue 47): ``cryptography``'s OpenSSL
ChaCha20 (the CPU path) and :mod:`dplora.mechanism.chacha`'s torch integer ops (the CUDA path, here run on CPU),
each as stream alone and as a full noise draw, in values/s (32 stream bytes per value), with their ratio. On
CUDA the table's stream column times the torch keystream on the device, the one the noise uses there.

Usage: ``python scripts/bench_noise.py [--device cuda] [--sizes 500000,5000000,40000000] [--compare-values N]
[--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dplora.mechanism import noise as noise_module
from dplora.mechanism.chacha import chacha20_words64
from dplora.mechanism.noise import BYTES_PER_VALUE, SUMMED_DRAWS, CsprngGaussian, chacha20_keystream


def _timed(fn, device: torch.device, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def _rough_step(P: int, device: torch.device, batch: int = 8):
    param = torch.nn.Parameter(torch.zeros(P, device=device))
    opt = torch.optim.AdamW([param], lr=1e-3)
    G = torch.randn(batch, min(P, 5_000_000), device=device)  # the clip's (B, P) work, capped in memory

    def step():
        norms = G.norm(dim=1, keepdim=True)
        clipped = (G * (1.0 / norms).clamp(max=1.0)).sum(dim=0)
        param.grad = torch.zeros(P, device=device)
        param.grad[: clipped.numel()] = clipped
        opt.step()

    step()  # allocate the optimizer state
    return step


def compare_cpu_generators(values: int, repeat: int = 2) -> dict[str, float]:
    """CPU throughput in values/s of both keystreams (stream alone, and a full noise draw), best of ``repeat``.

    Returns {"cryptography stream", "torch stream", "cryptography noise", "torch noise"} → values/s. The torch
    noise draw is :meth:`CsprngGaussian.normal` with the CPU admitted to ``DEVICE_STREAM_TYPES`` for the call.
    """
    cpu = torch.device("cpu")
    key, nonce = bytes(32), bytes(12)
    gen = CsprngGaussian()
    times = {
        "cryptography stream": _timed(lambda: chacha20_keystream(key, nonce, values * BYTES_PER_VALUE), cpu, repeat),
        "torch stream": _timed(lambda: chacha20_words64(key, nonce, 0, values * SUMMED_DRAWS), cpu, repeat),
        "cryptography noise": _timed(lambda: gen.normal(values, 1.0), cpu, repeat),
    }
    saved = noise_module.DEVICE_STREAM_TYPES
    noise_module.DEVICE_STREAM_TYPES = frozenset({"cpu", *saved})
    try:
        times["torch noise"] = _timed(lambda: gen.normal(values, 1.0), cpu, repeat)
    finally:
        noise_module.DEVICE_STREAM_TYPES = saved
    return {name: values / t for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", default="500000,5000000,40000000")
    parser.add_argument("--compare-values", type=int, default=65536, help="values per draw in the CPU comparison")
    parser.add_argument("--json", type=Path, help="also write the rows here (scripts/gpu_table.py reads them)")
    args = parser.parse_args()
    device = torch.device(args.device)
    gen = CsprngGaussian()
    print(f"device {device}, torch threads {torch.get_num_threads()}, {BYTES_PER_VALUE} stream bytes per value")
    rates = compare_cpu_generators(args.compare_values)
    print(f"CPU, {args.compare_values:,} values per draw (values/s, best of 2):")
    for what in ("stream", "noise"):
        c, t = rates[f"cryptography {what}"], rates[f"torch {what}"]
        print(f"  {what:>6}: cryptography {c:,.0f}  torch ChaCha20 {t:,.0f}  cryptography/torch {c / t:,.1f}x")
    on_device = device.type in noise_module.DEVICE_STREAM_TYPES
    rows = []
    print(f"{'P':>11} {'stream s':>9} {'noise s':>9} {'torch.normal s':>15} {'rough step s':>13} {'noise/step':>11}")
    for P in (int(s) for s in args.sizes.split(",")):
        repeat = 2 if P <= 500_000 else 1
        if on_device:  # the keystream the noise uses there
            stream = _timed(
                lambda P=P: chacha20_words64(bytes(32), bytes(12), 0, P * SUMMED_DRAWS, device=device), device, repeat
            )
        else:
            stream = _timed(lambda P=P: chacha20_keystream(bytes(32), bytes(12), P * BYTES_PER_VALUE), device, repeat)
        noise = _timed(lambda P=P: gen.normal(P, 1.0, device=device), device, repeat)
        old = _timed(lambda P=P: torch.normal(0.0, 1.0, size=(P,), device=device), device, repeat)
        rough = _timed(_rough_step(P, device), device, repeat)
        print(f"{P:>11,} {stream:>9.3f} {noise:>9.3f} {old:>15.3f} {rough:>13.3f} {noise / rough:>10.1f}x")
        rows.append(dict(P=P, stream_s=stream, noise_s=noise, torch_normal_s=old, rough_step_s=rough))
    if args.json:
        report = dict(device=str(device), cpu_values_per_s=rates, rows=rows)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
