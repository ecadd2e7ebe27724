"""``dplora budget``: the dry run through the CLI (typer CliRunner), its JSON, its plot and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import budget_cli
from support.budget_cli import CONTRACT, budget, budget_json, write_csv

TOL = 0.02


JSON_KEYS = {
    "num_units",
    "sample_rate",
    "steps",
    "noise_multiplier",
    "epsilon",
    "delta",
    "accountant",
    "adjacency",
}


_fresh_cache = budget_cli.fresh_workdir  # the two fixtures both tiers use
config = budget_cli.budget_config


def assert_one_line_error(res, *fragments: str) -> str:
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert res.stdout == ""
    return lines[0]


# q = 100/10000 = 0.01 with δ·N = 0.1 (N=100000, B=1000 would put δ = 1e-5 exactly at 1/N: refused, below)
DECLARED = [
    "privacy.accountant=rdp",
    "privacy.num_units=10000",
    "training.expected_batch_size=100",
    "privacy.noise_multiplier=1",
    "privacy.target_epsilon=10",
]


@pytest.mark.parametrize(("steps", "expected"), [(300, 1.451), (600, 1.748)])
def test_budget_json_declared_units(config, steps, expected):
    report = budget_json(config, *DECLARED, f"training.steps={steps}")
    assert JSON_KEYS <= report.keys()
    assert report["num_units"] == 10000 and report["num_units_source"] == "contract"
    assert report["sample_rate"] == 0.01
    assert report["steps"] == steps
    assert report["noise_multiplier"] == 1.0 and report["noise_source"] == "contract"
    assert report["epsilon"] == pytest.approx(expected, abs=TOL)
    assert report["delta"] == 1e-5 and _plan_warnings(report) == []
    # 100 units in the data under a declared 10,000: the local check says so, without the count
    assert [w for w in report["warnings"] if "fewer than half of privacy.num_units=10000" in w and "100 " not in w]
    assert report["accountant"] == "rdp" and report["accountant_version"].startswith("opacus ")
    assert report["adjacency"] == "add_remove"
    assert report["epsilon_curve"][-1] == [steps, report["epsilon"]]
    assert report["not_covered_by_dp"]["unit_stats"]["num_units"] == 100  # the data is read: a check only


def test_budget_delta_equal_to_one_over_n_refused(config):
    """N=100000 with δ=1e-5 puts δ exactly at 1/N: refused, not silently accepted."""
    kept = [a for a in DECLARED if not a.startswith(("privacy.num_units=", "training.expected_batch_size="))]
    args = [*kept, "privacy.num_units=100000", "training.expected_batch_size=1000", "training.steps=300"]
    assert_one_line_error(budget(config, *args), "1/N", "N=100000")
    report = budget_json(config, *args, "privacy.delta=1e-6")
    assert report["sample_rate"] == 0.01 and _plan_warnings(report) == []


def test_budget_json_calibrated(config):
    report = budget_json(config, "privacy.target_epsilon=3")
    assert report["noise_source"] == "calibrated"
    assert report["epsilon"] <= 3.0
    assert report["sample_rate"] == 0.032 and report["steps"] == 24
    at = report["epsilon_at"]
    assert at["25%"]["epsilon"] <= at["50%"]["epsilon"] <= at["75%"]["epsilon"] <= report["epsilon"]


def test_budget_delta_warning(config):
    report = budget_json(config, "privacy.delta=5e-4", "privacy.noise_multiplier=1")
    assert len(_plan_warnings(report)) == 1 and "NIST SP 800-226" in _plan_warnings(report)[0]


def _plan_warnings(report: dict) -> list[str]:
    """The plan's warnings, without the local check of the data's units against the declared N."""
    return [w for w in report["warnings"] if "fewer than half of privacy.num_units" not in w]


def test_budget_declared_units_still_checks_the_data(config):
    """Item 8: with privacy.num_units declared, budget refuses what train refuses (reads header and units)."""
    report = budget_json(config, "privacy.noise_multiplier=1")
    assert report["num_units"] == 1000 and report["num_units_source"] == "contract"
    assert report["sample_rate"] == 32 / 1000  # N stays the declared public number, not the count (100)
    write_csv(Path("data.csv"), [(f"u{i}", f"question {i}", f"answer {i}") for i in range(50)])
    fewer = budget_json(config, "privacy.num_units=8", "training.expected_batch_size=4", "privacy.noise_multiplier=5")
    assert fewer["num_units"] == 8  # more units than declared: a local warning, not a refusal (issue 23)
    assert any("more protected units than privacy.num_units=8" in w for w in fewer["warnings"])
    assert_one_line_error(budget(config, "data.prompt_column=question"), "no column 'question'")
    ok = budget_json(config, "privacy.num_units=50", "training.expected_batch_size=4", "privacy.noise_multiplier=1")
    assert ok["num_units"] == 50 and ok["not_covered_by_dp"]["unit_stats"]["num_records"] == 50


def test_budget_labels_private_statistics(config):
    """Item 7: records-per-unit statistics carry the 'not covered by DP' label of metrics.jsonl."""
    rows = [(f"u{u}", f"question {u} {r}", f"answer {r}") for u in range(40) for r in range(1 + u % 11)]
    write_csv(Path("data.csv"), rows)
    args = ["privacy.num_units=null", "privacy.noise_multiplier=1", "privacy.target_epsilon=50"]
    args += ["privacy.protected_unit=user", "privacy.unit_key=user_id", "training.expected_batch_size=4"]
    report = budget_json(config, *args)
    assert "unit_stats" not in report
    private = report["not_covered_by_dp"]
    assert "not covered by DP" in private["note"] and private["unit_stats"]["records_per_unit"]["max"] == 11
    res = budget(config, *args, "--show-private")
    assert res.exit_code == 0, res.output
    (row,) = [ln for ln in res.stdout.splitlines() if "records per unit" in ln]
    assert "not covered by DP" in row and "max 11" in row
    assert "not covered by DP (ε)" in res.stdout


def test_budget_public_view_has_no_private_statistic_and_no_counted_private_n(config):
    """Issue 40: without a terminal (a CI log) or with --json and no --show-private, budget publishes public inputs
    only: no records-per-unit statistics, no data-count warning, no planning time, and a counted N where N is
    private is refused by the contract alone (exit 2, the same line whatever the data holds)."""
    write_csv(Path("data.csv"), [(f"u{u}", f"question {u}", "answer") for u in range(40)])
    public = budget_json(config, *DECLARED, "training.steps=300", private=False)
    assert "not_covered_by_dp" not in public and "seconds" not in public
    assert not [w for w in public["warnings"] if "privacy.num_units=10000" in w]
    assert public == budget_json(config, *DECLARED, "training.steps=300", private=False)  # same document again
    write_csv(Path("data.csv"), [(f"u{u}", f"question {u}", "answer") for u in range(41)])  # a neighbour
    assert budget_json(config, *DECLARED, "training.steps=300", private=False) == public
    errors = []
    for n in (40, 41):
        write_csv(Path("data.csv"), [(f"u{u}", f"question {u}", "answer") for u in range(n)])
        res = budget(config, "privacy.num_units=null", "privacy.noise_multiplier=1", "--json")
        assert res.exit_code == 2 and "declare a public (rounded) N" in res.stderr and str(n) not in res.stderr
        errors.append(res.output)
    assert errors[0] == errors[1]


def test_budget_plot_writes_png(config, tmp_path):
    out = tmp_path / "out.png"
    res = budget(config, "privacy.noise_multiplier=1", "--plot", out)
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_budget_plot_unwritable(config, tmp_path):
    assert_one_line_error(
        budget(config, "privacy.noise_multiplier=1", "--plot", tmp_path / "no" / "such" / "dir" / "out.png"), "plot"
    )


def test_huge_target_answers_with_rdp_by_the_cost_estimate(config):
    """ε=1e6 (case 3 of issue 7): PRV would need billions of grid points; RDP answers, exit 0, no OOM."""
    report = budget_json(config, "privacy.accountant=prv", "privacy.target_epsilon=1e6")
    assert report["accountant"] == "rdp" and "PRV would need" in report["accountant_note"]
    assert report["epsilon"] <= 1e6 and report["epsilon_curve"][0][0] == 1


def test_replace_one_outside_pld_range_exits_2(config):
    """δ=1e-15 is below PLD's truncated mass: replace-one has no other accountant, so the plan is refused."""
    assert_one_line_error(
        budget(config, "privacy.adjacency=replace_one", "privacy.accountant=pld", "privacy.delta=1e-15"),
        "replace_one needs PLD",
        "privacy.delta",
    )


def test_missing_contract_file(tmp_path):
    assert_one_line_error(budget(tmp_path / "missing.yaml"), "not found", "missing.yaml")


def test_bad_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("privacy: [unclosed\n  model: {\n")
    assert_one_line_error(budget(path), "not valid YAML")


def test_unknown_key_in_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONTRACT.replace("steps: 24}", "steps: 24, epocs: 3}"))
    assert_one_line_error(budget(path), "training.epocs")


def test_unknown_key_override(config):
    assert_one_line_error(budget(config, "privacy.bogus=1"), "privacy.bogus")


@pytest.mark.parametrize("key", ["target_epsilon", "max_grad_norm", "delta"])
@pytest.mark.parametrize("value", ["-1", "0", ".inf", ".nan", "inf", "nan", "-.inf"])
def test_bad_privacy_numbers(config, key, value):
    assert_one_line_error(budget(config, f"privacy.{key}={value}"), f"privacy.{key}")


@pytest.mark.parametrize("value", ["1", "1.5"])
def test_delta_at_least_one(config, value):
    assert_one_line_error(budget(config, f"privacy.delta={value}"), "privacy.delta")


@pytest.mark.parametrize("delta", ["1e-3", "2e-3"])
def test_delta_not_below_one_over_n(config, delta):
    assert_one_line_error(budget(config, f"privacy.delta={delta}"), "1/N")


def test_unreachable_target_rdp(config):
    line = assert_one_line_error(budget(config, "privacy.target_epsilon=0.05"), "cannot be reached")
    assert "pld" in line


def test_given_noise_over_target(config):
    assert_one_line_error(
        budget(config, "privacy.noise_multiplier=0.3", "privacy.target_epsilon=1"), "noise_multiplier"
    )


def test_replace_one_with_rdp(config):
    assert_one_line_error(budget(config, "privacy.adjacency=replace_one"), "replace_one", "pld")


def test_q_above_one(config):
    assert_one_line_error(budget(config, "training.expected_batch_size=2000"), "expected_batch_size", "N=1000")


def test_bad_override_syntax(config):
    assert_one_line_error(budget(config, "privacy.delta"), "KEY=VALUE")


def test_missing_data_file(config):
    Path("data.csv").unlink()
    assert_one_line_error(budget(config, "privacy.num_units=null"), "data file not found", "data.csv")
    assert_one_line_error(budget(config), "data file not found", "data.csv")  # N declared: still refused


def test_data_path_is_a_folder(config):
    Path("folder").mkdir()
    assert_one_line_error(budget(config, "data.path=folder"), "data.path='folder' is a folder")


def test_missing_column(config):
    write_csv(Path("data.csv"), [("u1", "hello")], header=("user_id", "message"))
    assert_one_line_error(budget(config, "privacy.num_units=null"), "'reply'")


@pytest.mark.parametrize("content", ["", "user_id,message,reply\n"], ids=["zero-bytes", "header-only"])
def test_empty_data_file(config, content):
    Path("data.csv").write_text(content)
    assert_one_line_error(budget(config, "privacy.num_units=null"), "data.csv")


def test_budget_states_what_the_unit_covers(config):
    """The budget says what each unit protects; ticket-level carries the group-privacy caveat."""
    rows = [(f"t{u}", f"question {u} {r}", f"answer {r}") for u in range(40) for r in range(1 + u % 3)]
    write_csv(Path("data.csv"), rows)
    common = ["privacy.num_units=null", "privacy.noise_multiplier=1", "privacy.target_epsilon=50"]
    row = budget_json(config, *common)
    assert row["unit_note"].startswith("row-level") and "not a ticket or a customer" in row["unit_note"]
    ticket = budget_json(
        config, *common, "privacy.protected_unit=ticket", "privacy.unit_key=user_id", "training.expected_batch_size=4"
    )
    assert "group privacy" in ticket["unit_note"]
