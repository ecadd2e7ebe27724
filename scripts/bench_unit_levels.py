"""Benchmark: unit-level (ticket, user) against row-level DP-LoRA on the same data, real model, one table.

For each pair of runs on the same data it reports N_units, records per unit (min/median/p95/max, before the
cap, operator-only), ε, T and seconds per logical step (median of metrics.jsonl). Needs a signing key.

    .venv/bin/python scripts/bench_unit_levels.py --key demo/signing.key [--steps 20] [--which twcs,tickets]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DPLORA = str(Path(sys.executable).with_name("dplora"))
TWCS_SRC = ROOT.parent / "shared" / "data" / "twcs_customer_support_twitter" / "twcs_first5000.csv"


def _run(args: list[str]) -> str:
    proc = subprocess.run([DPLORA, *args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"dplora {' '.join(args[:2])} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    return proc.stdout


def _one(config: str, out: str, key: str, overrides: list[str]) -> dict:
    ov = [*overrides, f"training.output_dir={out}"]
    budget = json.loads(_run(["budget", config, "--json", "--show-private", *ov]))
    _run(["train", config, *ov, "--signing-key", key, "--overwrite", "--no-progress"])
    lines = [json.loads(x) for x in (ROOT / out / "metrics.jsonl").read_text().splitlines()]
    secs = [x["seconds"] for x in lines if "step" in x]
    records = [x["not_covered_by_dp"]["records"] for x in lines if "step" in x]
    return {
        "unit": budget["protected_unit"],
        "N_units": budget["num_units"],
        "records_per_unit": budget["not_covered_by_dp"]["unit_stats"]["records_per_unit"],
        "dropped_by_cap": budget["not_covered_by_dp"]["unit_stats"]["dropped_by_cap"],
        "q": round(budget["sample_rate"], 5),
        "T": budget["steps"],
        "sigma": round(budget["noise_multiplier"], 4),
        "epsilon": round(budget["epsilon"], 4),
        "accountant": budget["accountant"],
        "s_per_step_median": round(statistics.median(secs), 2),
        "records_per_step_mean": round(statistics.mean(records), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--key", required=True, help="Ed25519 signing key (dplora keygen)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--which", default="twcs,tickets")
    args = ap.parse_args()
    steps = [f"training.steps={args.steps}"]
    rows = {}
    if "tickets" in args.which:
        _run(["demo-data", "demo/tickets_multi.csv", "--tickets", "1000", "--max-turns", "3", "--overwrite"])
        rows["tickets: ticket-level"] = _one("configs/tickets_ticket_level.yaml", "demo/bench-ticket", args.key, steps)
        row_ov = [*steps, "privacy.protected_unit=row", "privacy.unit_key=null", "privacy.max_records_per_unit=null"]
        rows["tickets: row-level"] = _one(
            "configs/tickets_ticket_level.yaml", "demo/bench-ticket-row", args.key, row_ov
        )
    if "twcs" in args.which:
        _run(["prepare-twcs", str(TWCS_SRC), "demo/twcs_pairs.csv", "--overwrite"])
        rows["twcs: user-level"] = _one("configs/twcs_user_level.yaml", "demo/bench-twcs-user", args.key, steps)
        row_ov = [*steps, "privacy.protected_unit=row", "privacy.unit_key=null", "privacy.max_records_per_unit=null"]
        rows["twcs: row-level"] = _one("configs/twcs_user_level.yaml", "demo/bench-twcs-row", args.key, row_ov)
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
