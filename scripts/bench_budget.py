"""Time ``dplora budget`` per accountant in fresh processes, with a cold and a warm calibration cache.

Setting: N = 10000 declared units, expected batch 100 (q = 0.01), T = 1000 steps, target ε = 3, δ = 1e-5,
σ calibrated. For each accountant the first run starts from an empty ``$DPLORA_CACHE_DIR`` (cold: the σ search
runs), the next ones reuse it (warm: σ from the cache; ε and the ε curve are still computed). The contract's
data.csv (10,000 rows) is read as ``budget`` reads it. Prints one table: wall time of the whole process (median
cold, median and best warm) and the planning time the command reports itself; then the same for
``budget --recommend`` (the planner; no data read).

A third mode times the planner's B × E search (``training.expected_batch_size=auto training.epochs=auto
training.max_epochs=20 --recommend``). Each cell also gives the child's CPU seconds (user + system), which a busy
machine inflates less than wall time.

``--config PATH`` times that contract instead (for example configs/demo.yaml, whose data must exist: issue 29's
"under 2 s warm" is measured there), with the accountant it declares.

Usage: python scripts/bench_budget.py [--repeat 3] [--accountants rdp prv pld] [--config configs/demo.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(config: Path, accountant: str | None, cache: Path, *extra: str) -> tuple[float, dict]:
    """One ``dplora budget`` process: (wall seconds, its JSON report with ``cpu_seconds`` added)."""
    env = dict(os.environ, DPLORA_CACHE_DIR=str(cache))
    override = [f"privacy.accountant={accountant}"] if accountant else []
    cpu0 = _child_cpu()
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*_command(), "budget", str(config), "--json", "--show-private", *extra, *override],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"dplora budget failed for {accountant}: {proc.stderr.strip()}")
    return wall, json.loads(proc.stdout) | {"cpu_seconds": _child_cpu() - cpu0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="cold and warm runs per accountant (median shown)")
    parser.add_argument("--accountants", nargs="+", default=["rdp", "prv", "pld"])
    parser.add_argument("--config", type=Path, help="time this contract (its own accountant) instead")
    parser.add_argument("--no-search", action="store_true", help="skip the B × E search (code without epochs: auto)")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="dplora-bench-") as tmp:
        if args.config is not None:
            config, cwd_accountants = args.config.resolve(), [None]
            os.chdir(args.config.resolve().parents[1])  # a relative data.path is read from the project root
        else:
            config, cwd_accountants = Path(tmp) / "contract.yaml", args.accountants
            config.write_text(CONTRACT)
            rows_csv = ["message,reply"] + [f"question {i},answer {i}" for i in range(10000)]
            (Path(tmp) / "data.csv").write_text("\n".join(rows_csv) + "\n")
            os.chdir(tmp)
        search = ["--recommend", "training.expected_batch_size=auto", "training.epochs=auto", "training.max_epochs=20"]
        for mode in ([], ["--recommend"], *(() if args.no_search else (search,))):
            for accountant in cwd_accountants:
                cold, warm, report = [], [], None
                for i in range(args.repeat):
                    cache = Path(tmp) / f"cache-{accountant}-{i}-{len(mode)}"
                    wall, report = run_once(config, accountant, cache, *mode)  # empty cache: σ search runs
                    cold.append((wall, report["seconds"], report["cpu_seconds"]))
                    wall, warm_report = run_once(config, accountant, cache, *mode)  # σ from the cache
                    warm.append((wall, warm_report["seconds"], warm_report["cpu_seconds"]))
                    assert warm_report["noise_multiplier"] == report["noise_multiplier"]
                    shutil.rmtree(cache, ignore_errors=True)
                name = "budget" if not mode else "budget --recommend" if len(mode) == 1 else "budget B×E search"
                rows.append((name, report["accountant"], report, cold, warm))

    def med(pairs, k):
        return statistics.median(p[k] for p in pairs)

    setting = args.config or "q=0.01, T=1000, target ε=3, δ=1e-5, N=10000 declared"
    print(f"dplora budget, {setting}; median (and best warm) of {args.repeat} runs")
    cols = ("cold wall s", "cold plan s", "cold cpu s", "warm wall s", "best warm s", "warm plan s", "warm cpu s")
    header = f"{'command':<18} {'accountant':<10} {'σ':>8} {'ε':>7} " + " ".join(f"{c:>12}" for c in cols)
    print(header)
    print("-" * len(header))
    for command, accountant, report, cold, warm in rows:
        print(
            f"{command:<18} {accountant:<10} {report['noise_multiplier']:>8.4f} {report['epsilon']:>7.4f} "
            f"{med(cold, 0):>12.2f} {med(cold, 1):>12.2f} {med(cold, 2):>12.2f} {med(warm, 0):>12.2f} "
            f"{min(w[0] for w in warm):>12.2f} {med(warm, 1):>12.2f} {med(warm, 2):>12.2f}"
        )


if __name__ == "__main__":
    main()
