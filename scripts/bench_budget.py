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

``--phases`` instead splits one cold ``budget`` of the contract (default configs/demo.yaml's numbers: q = 0.032,
T = 24, ε 8, δ 1e-5, PRV) into the CPU seconds of its parts, in fresh processes with an empty cache: the CLI's
imports, the RDP calibration that starts the numerical accountant's bracket, the numerical calibration, the checked
ε curve and the attack ceiling (the PLD at the finest interval that ``verify`` can recompute in time). CPU seconds
(``time.process_time``) are what a busy machine inflates least.

Usage: python scripts/bench_budget.py [--repeat 3] [--accountants rdp prv pld] [--config configs/demo.yaml]
       python scripts/bench_budget.py --phases [--repeat 3]
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


PHASES = """
import json, os, sys, tempfile, time
os.environ["DPLORA_CACHE_DIR"] = tempfile.mkdtemp()
q, steps, target, delta, accountant = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), 1e-5, sys.argv[4]
cpu = time.process_time
t = [cpu()]
import dplora.cli.app  # noqa: F401  (the CLI and what it imports before any command runs)
t.append(cpu())
import scipy.special, scipy.optimize  # noqa: E401  (the accountants' first import: Opacus's RDP needs them)
t.append(cpu())
from dplora.accounting.calibration import calibrate
from dplora.accounting.checked import FLOOR, checked_curve, numerical_chain
from dplora.accounting.cost import tolerance_for
from dplora.accounting.events import Adjacency, DpSgdEvent
kw = dict(target_epsilon=target, sample_rate=q, steps=steps, delta=delta, adjacency="add_remove")
calibrate(accountant=FLOOR, **kw)
t.append(cpu())
sigma, _ = calibrate(accountant=accountant, **kw)
t.append(cpu())
event = DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps, adjacency=Adjacency.ADD_REMOVE)
chain = numerical_chain(accountant, Adjacency.ADD_REMOVE)
checked_curve(event, delta, chain, sorted({max(1, steps * k // 4) for k in (1, 2, 3, 4)}), tolerance_for(target))
t.append(cpu())
from dplora.accounting.ceiling import attack_ceiling
attack_ceiling(event)
t.append(cpu())
names = ["imports (CLI)", "imports (scipy)", "RDP calibration", "numerical calibration", "checked ε curve", "ceiling"]
print(json.dumps(dict(zip(names, [b - a for a, b in zip(t, t[1:])]))))
"""


def phases(repeat: int, q: float = 0.032, steps: int = 24, target: float = 8.0, accountant: str = "prv") -> None:
    """Print the median CPU seconds of each part of a cold ``budget`` (see the module's docstring)."""
    runs = []
    for _ in range(repeat):
        args = [sys.executable, "-c", PHASES, repr(q), str(steps), repr(target), accountant]
        proc = subprocess.run(args, capture_output=True, text=True, check=True)
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"cold budget parts, q={q:g}, T={steps}, target ε={target:g}, δ=1e-5, {accountant}; median CPU s of {repeat}")
    for name in runs[0]:
        print(f"  {name:<24} {statistics.median(r[name] for r in runs):6.2f}")
    print(f"  {'total':<24} {statistics.median(sum(r.values()) for r in runs):6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="cold and warm runs per accountant (median shown)")
    parser.add_argument("--accountants", nargs="+", default=["rdp", "prv", "pld"])
    parser.add_argument("--config", type=Path, help="time this contract (its own accountant) instead")
    parser.add_argument("--no-search", action="store_true", help="skip the B × E search (code without epochs: auto)")
    parser.add_argument("--phases", action="store_true", help="CPU seconds of each part of a cold budget")
    args = parser.parse_args()
    if args.phases:
        phases(args.repeat)
        return

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
