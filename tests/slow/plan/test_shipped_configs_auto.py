"""Issue 42.4: ``training.expected_batch_size: auto`` works on every shipped config (their ``steps`` of 20 or 24
are a step cap below the planner's floor of 50, which the rule now takes as the compute budget).

Each config runs through ``dplora budget CONFIG training.expected_batch_size=auto --json`` on demo data of its own
shape (columns and record format), and the planner's choice is checked against a brute force of the rule.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dplora.accounting.calibration import calibrate
from dplora.cli.app import app
from dplora.plan.planner import batch_options, recommend

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "configs").glob("*.yaml"))


def test_a_cap_below_the_floor_is_the_floor_and_the_choice_is_the_rules_brute_force():
    args = {"num_units": 1000, "target_epsilon": 8.0, "delta": 1e-5, "accountant": "rdp", "adjacency": "add_remove"}
    rec = recommend(**args, lr_ref=2e-3, max_steps=24)
    rows = []
    for b in batch_options(1000):
        t = min(math.ceil(3 * 1000 / b), 24)
        if t < 24:  # the floor is the cap
            continue
        sigma, _ = calibrate(
            target_epsilon=8.0, sample_rate=b / 1000, steps=t, delta=1e-5, accountant="rdp", adjacency="add_remove"
        )
        rows.append((sigma / b, -t, b, t))
    best = min(rows)
    assert (rec.choice.expected_batch_size, rec.choice.steps) == (best[2], best[3])
    assert rec.choice.steps == 24 and rec.to_dict()["inputs"]["min_steps"] == 24
    below = {c.expected_batch_size for c in rec.candidates if c.excluded and "below the minimum" in c.excluded}
    assert below == {192, 256, 384, 512, 768, 1000}  # ceil(3000/192) = 16 < 24, and every larger B
    weighed = [c.expected_batch_size for c in rec.candidates if c.noise_multiplier is not None]
    assert weighed == [128]  # the front: every smaller B has a smaller q and more steps
    assert recommend(**args, lr_ref=2e-3, max_steps=60).to_dict()["inputs"]["min_steps"] == 50  # unchanged above


def _demo_data(folder: Path, config: Path) -> Path:
    """A small data file with the columns and record format ``config`` reads (demo tickets; bitext: its columns)."""
    from dplora.data.demo import write_tickets

    text = config.read_text()
    if "record_format: messages" in text:
        path = folder / "chat.jsonl"
        write_tickets(path, num_tickets=60, seed=0, record_format="messages")
        return path
    path = folder / "tickets.csv"
    write_tickets(path, num_tickets=60, seed=0, max_turns=2)
    if "instruction" in text:  # Bitext's columns
        lines = path.read_text().splitlines()
        lines[0] = lines[0].replace("message", "instruction").replace("reply", "response")
        path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_shipped_config_plans_with_auto(tmp_path, monkeypatch, config):
    import yaml

    monkeypatch.chdir(tmp_path)
    data = _demo_data(tmp_path, config)
    raw = yaml.safe_load(config.read_text())
    cap = raw["training"]["steps"]
    res = CliRunner().invoke(
        app, ["budget", str(config), "training.expected_batch_size=auto", f"data.path={data}", "--json"]
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    rec = report["recommendation"]
    n = raw["privacy"]["num_units"]
    assert rec["inputs"]["num_units"] == n and rec["inputs"]["min_steps"] == min(50, cap)
    eligible = [c for c in rec["candidates"] if c["excluded"] is None]
    assert eligible and all(c["steps"] == cap for c in eligible)  # T = ceil(3N/B) ≥ cap for each eligible B
    assert all(c["expected_batch_size"] <= n for c in rec["candidates"])
    best = min(eligible, key=lambda c: (c["noise_per_unit"], -c["steps"], c["expected_batch_size"]))
    assert (report["expected_batch_size"], report["steps"]) == (best["expected_batch_size"], cap)
    assert report["epsilon"] <= raw["privacy"]["target_epsilon"]
