"""Time ``dplora budget`` per accountant in fresh processes, with a cold and a warm calibration cache.

Setting: N = 10000 declared units, expected batch 100 (q = 0.01), T = 1000 steps, target ε = 3, δ = 1e-5,
σ calibrated. For each accountant the first run starts from an empty ``$DPLORA_CACHE_DIR`` (cold: the σ search
runs), the next ones reuse it (warm: σ from the cache; ε and the ε curve are still computed). Prints one
table: wall time of the whole process and the planning time the command reports itself.

Usage: python scripts/bench_budget.py [--repeat 3] [--accountants rdp prv pld]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONTRACT = """\
privacy: {protected_unit: row, adjacency: add_remove, target_epsilon: 3, delta: 1.0e-5, accountant: rdp,
          max_grad_norm: 1.0, num_units: 10000}
model: {path: /nonexistent}
data: {path: data.csv, prompt_column: message, response_column: reply}
training: {expected_batch_size: 100, steps: 1000}
"""


def _command() -> list[str]:
    exe = Path(sys.executable).with_name("dplora")
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from dplora.cli.app import main; main()"]


def run_once(config: Path, accountant: str, cache: Path) -> tuple[float, dict]:
    env = dict(os.environ, DPLORA_CACHE_DIR=str(cache))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*_command(), "budget", str(config), "--json", f"privacy.accountant={accountant}"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"dplora budget failed for {accountant}: {proc.stderr.strip()}")
    return wall, json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="cold and warm runs per accountant (median shown)")
    parser.add_argument("--accountants", nargs="+", default=["rdp", "prv", "pld"])
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="dplora-bench-") as tmp:
        config = Path(tmp) / "contract.yaml"
        config.write_text(CONTRACT)
        for accountant in args.accountants:
            cold, warm, report = [], [], None
            for i in range(args.repeat):
                cache = Path(tmp) / f"cache-{accountant}-{i}"
                wall, report = run_once(config, accountant, cache)  # empty cache: σ search runs
                cold.append((wall, report["seconds"]))
                wall, warm_report = run_once(config, accountant, cache)  # σ from the cache
                warm.append((wall, warm_report["seconds"]))
                assert warm_report["noise_multiplier"] == report["noise_multiplier"]
                shutil.rmtree(cache, ignore_errors=True)
            rows.append((accountant, report, cold, warm))

    def med(pairs, k):
        return statistics.median(p[k] for p in pairs)

    print(f"dplora budget, q=0.01, T=1000, target ε=3, δ=1e-5, N=10000 declared; median of {args.repeat} runs")
    cols = ("cold wall s", "cold plan s", "warm wall s", "warm plan s")
    header = f"{'accountant':<10} {'σ':>8} {'ε':>7} " + " ".join(f"{c:>12}" for c in cols)
    print(header)
    print("-" * len(header))
    for accountant, report, cold, warm in rows:
        print(
            f"{accountant:<10} {report['noise_multiplier']:>8.4f} {report['epsilon']:>7.4f} "
            f"{med(cold, 0):>12.2f} {med(cold, 1):>12.2f} {med(warm, 0):>12.2f} {med(warm, 1):>12.2f}"
        )


if __name__ == "__main__":
    main()
