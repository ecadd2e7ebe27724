"""The one table that ends ``scripts/gpu_check.sh`` (issue 47): every stage of a GPU check in one markdown table.

Reads what the stages left in OUT_DIR: ``stages.txt`` (the ``STAGE name: OK (12s)`` lines), ``scale-*/scale.json``
(stage ``scale-1b`` reads ``scale-llama-1b/``; ``scripts/bench_scale.py``: s/step, tokens/s, peak MiB and largest
batch per seq, variant and mode),
``noise.json`` (``scripts/bench_noise.py --json``: noise seconds per logical step at each LoRA size P) and
``utility/utility.json`` (``scripts/utility_bench.py``: held-out loss or accuracy per run). Columns: stage, status
and seconds, the row, DP/non-DP time and memory ratios (``dplora_fast`` over ``non_dp`` at the same seq and
variant), DP tokens/s, DP largest batch, noise seconds per step (and its share of a rough step), utility. A stage
without output gives one row with its status only. Writes OUT_DIR/gpu_check.md and prints it.

Usage: ``python scripts/gpu_table.py OUT_DIR``
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HEADER = (
    "| stage | status | row | DP/non-DP time | DP/non-DP memory | DP tokens/s | DP largest batch | noise s/step | "
    "utility |"
)


def _stages(out: Path) -> dict[str, str]:
    path = out / "stages.txt"
    text = path.read_text() if path.exists() else ""
    return {m[1]: m[2] for m in re.finditer(r"^STAGE ([\w-]+): (.+)$", text, flags=re.M)}


def _scale_rows(path: Path) -> list[list[str]]:
    rows = json.loads(path.read_text())["rows"]
    base = {(r["seq"], r["variant"]): r for r in rows if r["mode"] == "non_dp" and "s_per_step" in r}
    out = []
    for r in rows:
        if r["mode"] == "non_dp":
            continue
        label = f"seq {r['seq']} {r['variant']} B {r['batch']}"
        ref = base.get((r["seq"], r["variant"]))
        if "s_per_step" not in r:
            out.append([label, r.get("status", "failed"), "", "", "", "", ""])
            continue
        time_ratio = f"{r['s_per_step'] / ref['s_per_step']:.2f}" if ref else ""
        mem_ratio = f"{r['peak_mib'] / ref['peak_mib']:.2f}" if ref else ""
        out.append([label, time_ratio, mem_ratio, f"{r['tokens_per_s']:.0f}", str(r.get("largest_batch", "")), "", ""])
    return out


def _noise_rows(path: Path) -> list[list[str]]:
    report = json.loads(path.read_text())
    return [
        [
            f"P {r['P']:,} ({report['device']})",
            "",
            "",
            "",
            "",
            f"{r['noise_s']:.4f} ({r['noise_s'] / r['rough_step_s']:.1f}× a rough step)",
            "",
        ]
        for r in report["rows"]
    ]


def _utility_rows(path: Path) -> list[list[str]]:
    out = []
    for r in json.loads(path.read_text())["rows"]:
        e = r.get("eval", {})
        value = f"loss {e['loss']:.4f}" if "loss" in e else (f"accuracy {e['accuracy']:.3f}" if "accuracy" in e else "")
        eps = "" if r["kind"] in ("base", "control") else f" ε {r.get('epsilon', '')}"
        out.append([f"{r['task']} {r['name']}{eps}", "", "", "", "", "", value])
    return out


def table(out: Path) -> str:
    """The markdown table of the check in ``out`` (see the module docstring); never raises on a missing file."""
    sources = {"noise": [out / "noise.json"], "utility": [out / "utility" / "utility.json"]}
    lines = [HEADER, "|" + "---|" * 9]
    for name, status in _stages(out).items():
        rows: list[list[str]] = []
        scale = (
            sorted(out.glob(f"scale-*{name.removeprefix('scale-')}/scale.json")) if name.startswith("scale-") else []
        )
        for path in sources.get(name, scale):
            if path.exists():
                reader = _noise_rows if name == "noise" else _utility_rows if name == "utility" else _scale_rows
                try:
                    rows += reader(path)
                except (KeyError, ValueError, TypeError, ZeroDivisionError) as err:
                    rows.append([f"unreadable {path.name}: {type(err).__name__}", "", "", "", "", "", ""])
        for i, row in enumerate(rows or [["", "", "", "", "", "", ""]]):
            lines.append("| " + " | ".join([name if i == 0 else "", status if i == 0 else "", *row]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/gpu_table.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    text = table(out)
    (out / "gpu_check.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
