"""Red-team probes of the planner's public guarantees: what a tampered accounting cache (a user-writable file under
$DPLORA_CACHE_DIR) makes dplora state, and how the new epoch keys take loose input.

Each test states the guarantee; both cache findings are fixed (nothing stated is read from the cache) and kept as
plain tests."""

from __future__ import annotations

import json

import pytest
from conftest import contract_dict, write_contract
from typer.testing import CliRunner

from dplora.accounting import cache
from dplora.accounting.ceiling import CEILING_FPRS, attack_ceiling, ceiling_entry
from dplora.accounting.events import DpSgdEvent
from dplora.cli.app import app
from dplora.contract.loader import parse_contract
from dplora.plan.training import make_plan


def _tamper(marker: str, value) -> int:
    """Replace every cache entry whose key contains ``marker`` with ``value(old)``; returns how many."""
    data = cache.load()
    hits = [k for k in data if marker in k]
    for k in hits:
        cache.put(k, value(data[k]))
    return len(hits)


def test_a_tampered_cache_never_lowers_the_stated_attack_ceiling(tmp_path, monkeypatch):
    """A cached ceiling edited to TPR = α (no leak at all) lies in [α, 1], so a range check passes it: a stated
    ceiling (budget, the record, the card, an audit's comparison) must never be read from the cache."""
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))
    event = DpSgdEvent(sample_rate=0.032, noise_multiplier=0.55, steps=20)
    honest = attack_ceiling(event, use_cache=False)  # about 6 % TPR at 1 % FPR
    attack_ceiling(event, use_cache=True)  # writes the interval choice and the ceiling into the cache
    assert _tamper("ceiling-v1/", lambda _old: list(CEILING_FPRS)) == 1
    assert attack_ceiling(event, use_cache=True).at(0.01) == pytest.approx(0.01)  # the tamper took
    stated = attack_ceiling(event)  # what budget and train (the signed record, the model card) state
    assert stated.at(0.01) >= honest.at(0.01) - 1e-6, (stated.at(0.01), honest.at(0.01))
    assert honest.at(0.01) > 0.05
    entry = ceiling_entry(event)  # the record's entry, as written by train
    assert entry["true_positive_rate_at"]["1%"] >= honest.at(0.01) - 1e-6, entry


def test_a_tampered_cache_never_lowers_the_ceiling_budget_prints(tmp_path, monkeypatch, tickets_csv):
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))
    raw = contract_dict(tmp_path / "model", tickets_csv, tmp_path / "out", privacy={"num_units": 1000})
    raw["training"].update({"expected_batch_size": 32, "steps": 20})
    cfg = write_contract(tmp_path / "c.yaml", raw)
    first = CliRunner().invoke(app, ["budget", str(cfg), "--json"])
    assert first.exit_code == 0, first.output
    honest = json.loads(first.stdout)["attack_ceiling"]["true_positive_rate_at"]
    plan = make_plan(parse_contract(raw), num_units=1000, num_units_source="contract")
    attack_ceiling(plan.event, use_cache=True)  # the TPRs in the cache, as an older dplora left them
    assert _tamper("ceiling-v1/", lambda _old: list(CEILING_FPRS)) >= 1
    second = CliRunner().invoke(app, ["budget", str(cfg), "--json"])
    assert second.exit_code == 0, second.output
    assert json.loads(second.stdout)["attack_ceiling"]["true_positive_rate_at"] == honest


@pytest.mark.parametrize("accountant", ["pld", "prv"])
def test_a_tampered_cache_never_lowers_the_epsilon_charged_for_a_stopped_run(tmp_path, monkeypatch, accountant):
    """Zeros are finite and non-decreasing, so a curve cached with its checkpoints edited to 0 would pass the
    curve's checks: ε at 25/50/75 % of T (budget) and the ε a stopped run is charged (FAILED.json, the ledger)
    must come from a computed curve."""
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))
    raw = contract_dict(tmp_path / "model", tmp_path / "d.csv", tmp_path / "out", privacy={"num_units": 1000})
    raw["privacy"]["accountant"] = accountant
    raw["training"].update({"expected_batch_size": 32, "steps": 20})
    contract = parse_contract(raw)
    honest = make_plan(contract, num_units=1000, num_units_source="contract")
    _tamper("|curve|", lambda old: [0.0] * len(old))  # what an older dplora cached: every checkpoint but T
    plan = make_plan(contract, num_units=1000, num_units_source="contract")
    assert plan.epsilon == honest.epsilon
    assert plan.epsilon_curve == honest.epsilon_curve
    spent, honest_spent = plan.epsilon_spent(10), honest.epsilon_spent(10)
    assert spent >= honest_spent - 1e-9 and honest_spent > 0.5, (spent, honest_spent)


@pytest.mark.parametrize("value", [True, "20"], ids=["bool", "quoted"])
def test_max_epochs_takes_only_a_number(tmp_path, value):
    raw = contract_dict(tmp_path / "model", tmp_path / "missing.csv", tmp_path / "out", privacy={"num_units": 1000})
    raw["training"].pop("steps")
    raw["training"].update({"expected_batch_size": "auto", "epochs": "auto", "max_epochs": value})
    cfg = write_contract(tmp_path / "c.yaml", raw)
    res = CliRunner().invoke(app, ["validate", str(cfg)])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "max_epochs" in lines[0], (res.exit_code, res.output)


def test_cache_tamper_helper_round_trips(tmp_path, monkeypatch):
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))
    cache.put("a|curve|b", [1.0])
    assert _tamper("|curve|", lambda old: [0.0] * len(old)) == 1
    assert json.loads((tmp_path / "cache" / "calibration.json").read_text()) == {"a|curve|b": [0.0]}


def test_a_compute_budget_past_every_candidates_step_limit_is_refused_in_one_line(tmp_path):
    raw = contract_dict(tmp_path / "model", tmp_path / "missing.csv", tmp_path / "out", privacy={"num_units": 1000})
    raw["training"].pop("steps")
    raw["training"].update({"expected_batch_size": "auto", "epochs": 1e8})
    cfg = write_contract(tmp_path / "c.yaml", raw)
    res = CliRunner().invoke(app, ["budget", str(cfg)])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, (res.exit_code, res.output)


def test_a_stated_ceiling_reads_nothing_from_the_cache(tmp_path, monkeypatch):
    """A finer PLD interval than the time limit allows, read from the cache, gives a lower (still valid) ceiling
    than verify recomputes; a stated ceiling therefore reads neither the interval choice nor the TPRs."""
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))
    event = DpSgdEvent(sample_rate=0.05, noise_multiplier=1.2, steps=20)
    honest = ceiling_entry(event)

    def no_read():
        raise AssertionError("a stated ceiling read the cache")

    monkeypatch.setattr(cache, "load", no_read)
    assert ceiling_entry(event) == honest
    assert attack_ceiling(event).tprs == attack_ceiling(event, use_cache=False).tprs


def _auto_contract(tmp_path, data, accountant: str) -> dict:
    raw = contract_dict(tmp_path / "model", data, tmp_path / "out", privacy={"num_units": 1000})
    raw["privacy"]["accountant"] = accountant
    raw["training"].pop("steps")
    raw["training"].update({"expected_batch_size": "auto", "epochs": 1})
    return raw


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_a_tampered_calibration_never_lowers_the_planners_stated_epsilon(
    tmp_path, monkeypatch, tickets_csv, accountant
):
    """The planner's table, `budget --recommend` and the record's optimization.planner state each candidate's ε:
    a cached σ is used only with its ε computed again, and a cached note never reaches the record."""
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))
    cfg = write_contract(tmp_path / "c.yaml", _auto_contract(tmp_path, tickets_csv, accountant))
    first = CliRunner().invoke(app, ["budget", str(cfg), "--recommend", "--json"])
    assert first.exit_code == 0, first.output
    honest = json.loads(first.stdout)
    lie = {"epsilon": 0.0, "note": "verified: ε = 0.1"}
    assert _tamper("|", lambda old: {**old, **lie} if isinstance(old, dict) else old) >= 1
    second = CliRunner().invoke(app, ["budget", str(cfg), "--recommend", "--json"])
    assert second.exit_code == 0, second.output
    stated = json.loads(second.stdout)
    assert "verified" not in second.stdout
    assert stated["epsilon"] == honest["epsilon"]
    got = {(c["expected_batch_size"], c["steps"]): c["epsilon"] for c in stated["recommendation"]["candidates"]}
    want = {(c["expected_batch_size"], c["steps"]): c["epsilon"] for c in honest["recommendation"]["candidates"]}
    assert (
        got == want and stated["recommendation"]["choice"]["epsilon"] == honest["recommendation"]["choice"]["epsilon"]
    )
    assert stated["recommendation"]["choice"]["epsilon"] > 7.9
    assert stated["recommendation"]["choice"]["attack_ceiling"] == honest["recommendation"]["choice"]["attack_ceiling"]


def test_a_cached_sigma_that_misses_the_target_is_recalibrated(tmp_path, monkeypatch):
    """A σ edited down in the cache (its ε above the target) is not a refusal, and one edited up (more noise than
    the target needs: the utility of every later run) is not taken: the plan calibrates again."""
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))
    raw = contract_dict(tmp_path / "model", tmp_path / "d.csv", tmp_path / "out", privacy={"num_units": 1000})
    raw["training"].update({"expected_batch_size": 32, "steps": 20})
    contract = parse_contract(raw)
    honest = make_plan(contract, num_units=1000, num_units_source="contract")
    for bad in (0.3, 2 * honest.noise_multiplier, 1.01 * honest.noise_multiplier, 1e-300, 1e300, float("nan"), True):
        assert _tamper("|", lambda old, bad=bad: {**old, "noise_multiplier": bad} if isinstance(old, dict) else old)
        plan = make_plan(contract, num_units=1000, num_units_source="contract")
        assert plan.noise_multiplier == honest.noise_multiplier and plan.epsilon == honest.epsilon, bad
