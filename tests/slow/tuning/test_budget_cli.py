"""The slow tier of tests/tuning/test_budget_cli.py, whose docstring describes the module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import budget_cli
from support.budget_cli import budget, budget_json, write_csv

_fresh_cache = budget_cli.fresh_workdir  # the two fixtures both tiers use
config = budget_cli.budget_config


def test_budget_table_output(config):
    res = budget(config)
    assert res.exit_code == 0, res.output
    assert "dplora budget" in res.stdout and "rdp" in res.stdout
    # off a terminal only the fixed line that says where private diagnostics would be (never a count)
    assert res.stderr.splitlines() == [
        "private diagnostics (records per unit, data-count warnings, planning time; NOT covered by DP): "
        "not printed here; --show-private prints them"
    ]


def test_budget_counts_units_from_data(config):
    rows = [(f"u{u}", f"question {u} {r}", f"answer {r}") for u in range(40) for r in range(1 + u % 3)]
    write_csv(Path("data.csv"), rows)
    report = budget_json(config, "privacy.num_units=null", "privacy.noise_multiplier=1", "privacy.target_epsilon=50")
    assert report["num_units"] == len(rows) and report["num_units_source"] == "data"
    assert report["not_covered_by_dp"]["unit_stats"]["num_units"] == len(rows)
    assert any("dplora train refuses to release on a counted N" in w for w in report["warnings"])  # add/remove
    assert report["sample_rate"] == pytest.approx(32 / len(rows))

    user = budget_json(
        config,
        "privacy.num_units=null",
        "privacy.noise_multiplier=1",
        "privacy.target_epsilon=50",
        "privacy.protected_unit=user",
        "privacy.unit_key=user_id",
        "training.expected_batch_size=4",
    )
    assert user["num_units"] == 40 and user["protected_unit"] == "user" and user["unit_key"] == "user_id"
    stats = user["not_covered_by_dp"]["unit_stats"]
    assert stats["num_units"] == 40 and stats["num_records"] == len(rows)
    assert stats["records_per_unit"]["min"] == 1 and stats["records_per_unit"]["max"] == 3
    assert user["sample_rate"] == 4 / 40


DEMO = Path(__file__).resolve().parents[3] / "configs" / "demo.yaml"


def test_small_population_warning_for_10_units_not_for_the_demo(config):
    """10 units (q = 0.2): one warning line saying what ε means there; the demo contract (N=1000 declared): none."""
    write_csv(Path("data.csv"), [(f"u{i}", f"question {i}", f"answer {i}") for i in range(10)])
    small = budget(config, "privacy.num_units=10", "training.expected_batch_size=2", "privacy.delta=1e-3")
    assert small.exit_code == 0, small.output
    lines = [line for line in small.stderr.splitlines() if "small population" in line]  # stderr, as train's
    assert len(lines) == 1 and lines[0].startswith("warning: N=10 protected units") and "k·ε" in lines[0]
    assert "warning:" not in small.stdout
    assert "q=0.2 is above 0.1" in lines[0]
    Path("demo").mkdir()
    write_csv(Path("demo/tickets.csv"), [(f"c{i}", f"question {i}", f"answer {i}") for i in range(1000)])
    demo = budget_json(DEMO, "privacy.accountant=rdp")  # N rows counted as train counts them: the demo holds out
    assert demo["num_units"] == 1000 and demo["sample_rate"] == 32 / 1000  # the declared public N (issue 23)
    assert 850 < demo["not_covered_by_dp"]["unit_stats"]["num_units"] < 950  # ~10 % held out (eval_fraction)
    assert demo["warnings"] == []


def test_real_process_stderr_is_one_line(config):
    """Library warnings (e.g. Opacus's 'Optimal order is the largest alpha') must not reach the terminal."""
    exe = Path(sys.executable).with_name("dplora")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from dplora.cli.app import main; main()"]
    proc = subprocess.run(
        [*cmd, "budget", str(config), "privacy.target_epsilon=0.05"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr


def test_a_large_eval_fraction_says_how_much_is_held_out(config):
    """Issue 42.10: eval_fraction 0.999 warns that 99.9 % of the units are held out (from the contract alone); an
    empty side is refused without a count of the records."""
    write_csv(Path("data.csv"), [(f"u{i}", f"question {i}", f"answer {i}") for i in range(3000)])
    held = budget(config, "privacy.num_units=3000", "data.eval_fraction=0.999", "privacy.delta=1e-5")
    assert held.exit_code == 0, held.output
    assert (
        "warning: data.eval_fraction=0.999 holds out about 99.9% of the protected units for evaluation: training "
        "sees about 0.1% of them"
    ) in held.stderr
    normal = budget(config, "privacy.num_units=3000", "data.eval_fraction=0.1", "privacy.delta=1e-5")
    assert normal.exit_code == 0 and "holds out about" not in normal.output
    write_csv(Path("data.csv"), [(f"u{i}", f"question {i}", f"answer {i}") for i in range(3)])
    empty = budget(config, "privacy.num_units=3", "data.eval_fraction=0.999", "privacy.delta=1e-2")
    assert empty.exit_code == 2
    assert "data.eval_fraction=0.999 leaves the training side empty; choose another fraction" in empty.output
    assert "records" not in empty.output
