"""Red team on issue 46, round 2 (the attack ceiling): inputs where a stated guarantee does not hold.

Each ``test_finding_*`` fails on branch rt46 at a0a5925. The reference is independent of dplora's PLD code: at
q = 1 the T-step mechanism is exactly μ-GDP with μ = s·√T/σ, its trade-off curve TPR(α) = Φ(Φ⁻¹(α) + μ) (Dong,
Roth & Su 2022, Def. 2.4), which no ceiling may state below; a mechanism with no noise lets a test reach TPR 1.
"""

from __future__ import annotations

import json
import math

import pytest
from conftest import ledger_show_json, ledger_with_charges
from scipy.stats import norm

from dplora.accounting.ceiling import ceiling_entry, ceiling_sentence, percent_up
from dplora.accounting.ceiling_compose import composed_ceiling
from dplora.accounting.events import DpSgdEvent
from dplora.cli.budget_view import tpr_cell
from dplora.release.verify import _check_attack_ceiling

FPRS = {"0.1%": 0.001, "1%": 0.01, "10%": 0.1}


def _exact(mu: float, alpha: float) -> float:
    return float(norm.cdf(norm.ppf(alpha) + mu))


SGD = {"mechanism": "dp_sgd", "sample_rate": 0.01, "noise_multiplier": 1.0, "steps": 10,
       "adjacency": "add_remove", "accountant": "pld"}  # fmt: skip


# ---------------------------------------------------------------------------------------------- findings


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_finding_noiseless_count_charge_vanishes_from_the_composed_ceiling(mechanism):
    """Guarantees 1 and 4. ``composed_ceiling`` reads ``PLDAccountant._pld`` directly, but dp_accounting composes a
    noise-0 Gaussian/Laplace event by setting ``_contains_non_dp_event`` and leaving ``_pld`` untouched; the
    ledger accepts such an event (``validate_events``: noise_multiplier >= 0). Input: one ``gaussian`` (or
    ``laplace``) event with noise_multiplier 0 (a count released without noise). Expected: TPR 1 (or not stated);
    observed: TPR = α at every FPR, 'no test beats guessing'."""
    entry = composed_ceiling([{"mechanism": mechanism, "noise_multiplier": 0.0}], "add_remove")
    assert not entry["available"] or all(v == 1.0 for v in entry["true_positive_rate_at"].values()), entry


def test_finding_ledger_show_drops_a_noiseless_charge_from_the_population_ceiling(tmp_path):
    """Guarantee 4 through ``dplora ledger show --json``: a population with one DP-SGD charge (q 0.01, σ 1,
    T 10) and one charge whose event is a noise-0 Gaussian count states the DP-SGD charge's ceiling alone
    (1.2 % at 1 % FPR) while its composed ε says n/a. Expected: 1.0 at every FPR or not stated."""
    db = ledger_with_charges(tmp_path / "l.sqlite3", [[SGD], [{"mechanism": "gaussian", "noise_multiplier": 0.0}]])
    res = ledger_show_json(db)
    assert res.exit_code == 0, res.output
    entry = json.loads(res.stdout)["populations"][0]["attack_ceiling"]
    assert not entry["available"] or all(v == 1.0 for v in entry["true_positive_rate_at"].values()), entry


def test_finding_ledger_show_crashes_on_a_noiseless_dp_sgd_charge(tmp_path):
    """Guarantee 5 (and 4): the ledger accepts a ``dp_sgd`` event with σ = 0 (``validate_events`` allows σ >= 0),
    then ``composed_ceiling`` calls ``out_of_range_reason`` whose dp_accounting GaussianPrivacyLoss raises
    ValueError('Standard deviation is not a positive real number: 0.0'); ``ledger show`` catches DploraError only,
    so the CLI exits 1 ('unexpected ValueError'). Expected: exit 0 stating ceiling 1.0 / not stated, or exit 2."""
    db = ledger_with_charges(tmp_path / "l.sqlite3", [[{**SGD, "noise_multiplier": 0.0}]])
    res = ledger_show_json(db)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code in (0, 2), res.output


SIGMA_JUST_ABOVE_3 = 2.244373  # q = 1, T = 1: exact TPR at 1 % FPR = 0.0300003042 (3.00003 %)


def test_finding_record_ceiling_is_rounded_below_the_exact_gaussian_curve():
    """Guarantee 1 (rounding in JSON and card). ``AttackCeiling.to_dict`` stores ``round(t, 6)`` (nearest, not
    up), and the card/verify/budget sentence rounds UP that already-rounded value. Input: q = 1, σ = 2.244373,
    T = 1, add/remove (exact μ-GDP, μ = 1/σ). Exact TPR at 1 % = 0.03000030: the record states 0.03 and the
    sentence 'can exceed 3.0 %', below the exact curve (should be ≥ 0.0300003 and '3.1 %')."""
    event = DpSgdEvent(sample_rate=1.0, noise_multiplier=SIGMA_JUST_ABOVE_3, steps=1)
    entry = ceiling_entry(event, use_cache=False)
    mu = 1.0 / SIGMA_JUST_ABOVE_3
    for key, alpha in FPRS.items():
        assert entry["true_positive_rate_at"][key] >= _exact(mu, alpha), key
    assert f"exceed {percent_up(_exact(mu, 0.01))} %" in ceiling_sentence(entry)  # '3.1 %', says '3.0 %'


def test_finding_budget_candidate_table_rounds_the_ceiling_to_nearest():
    """Guarantee 1 (rounding in text). ``budget --recommend``'s candidate table prints the 1 % ceiling with
    ``f"{100 * t:.2f} %"`` (dplora/tuning/budget.py:433), nearest, not up. Input: a candidate ceiling
    0.030049 at 1 %. Expected '3.01 %' (never below); observed '3.00 %'."""
    assert tpr_cell({"1%": 0.030049}) == f"{percent_up(0.030049, 2)} %"


def test_finding_verify_accepts_a_ceiling_edited_down_within_its_tolerance():
    """Guarantee 3 (and 1). ``same_ceiling`` accepts a recorded TPR up to 1e-4 BELOW the recomputed one (a two-sided
    tolerance, dplora/accounting/ceiling.py:453), and the card states the recorded value. Input: q = 1,
    σ = 2.2402, T = 1 (exact 1 % TPR 0.03005, card '3.1 %'), every recorded TPR lowered by 9e-5 (1 %: 0.02996,
    card '3.0 %'). Expected: verify fails (the recorded ceiling is below the mechanism's); observed: it passes."""
    event = DpSgdEvent(sample_rate=1.0, noise_multiplier=2.2402, steps=1)
    true = ceiling_entry(event, use_cache=False)
    edited = {**true, "true_positive_rate_at": {k: v - 9e-5 for k, v in true["true_positive_rate_at"].items()}}
    assert percent_up(edited["true_positive_rate_at"]["1%"]) != percent_up(true["true_positive_rate_at"]["1%"])
    predicate = {
        "mechanism": {"sample_rate": 1.0, "noise_multiplier": 2.2402, "steps": 1, "adjacency": "add_remove"},
        "attack_ceiling": edited,
    }
    with pytest.raises(Exception, match="attack ceiling"):
        _check_attack_ceiling(predicate)


# ---------------------------------------------------------------------------------------------- held


@pytest.mark.parametrize(("sigma", "steps"), [(0.05, 1), (1e3, 10**9), (1.0, 10**6)])
def test_held_q1_extreme_sigma_and_steps_stay_above_the_exact_curve(sigma, steps):
    """q = 1 at tiny σ and huge T goes through the closed form: never below Φ(Φ⁻¹(α) + √T/σ) (up to 6-decimal
    rounding, the finding above)."""
    entry = ceiling_entry(DpSgdEvent(sample_rate=1.0, noise_multiplier=sigma, steps=steps), use_cache=False)
    mu = math.sqrt(steps) / sigma
    for key, alpha in FPRS.items():
        assert entry["true_positive_rate_at"][key] >= _exact(mu, alpha) - 5e-7
