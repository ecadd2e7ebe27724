"""Red team on issue 46 (the attack ceiling and the audit's power): inputs where a stated guarantee does not hold.

Each ``test_*_finding_*`` fails on main at feef972 (each is a finding of the red-team report); the ``held_*`` tests
are the attacks that held, kept as regressions. References are independent of dplora's PLD code: the exact
Gaussian trade-off curve TPR(α) = Φ(Φ⁻¹(α) + μ) (Dong, Roth & Su 2022, Def. 2.4) at q = 1, and the exact
Neyman-Pearson curve of one Poisson-subsampled Gaussian (T = 1; likelihood ratio monotone in x, so threshold tests
are optimal), both directions of add/remove and dp_accounting's replace-one pair N(−1)/N(+1) mixtures.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from dplora.accounting.backends import exact_epsilon
from dplora.accounting.ceiling import _computed, ceiling_entry, tradeoff_tpr
from dplora.accounting.events import Adjacency, DpSgdEvent
from dplora.audit.attach import composed_claim
from dplora.audit.power import ceiling_comparison
from dplora.release.card import _ceiling
from dplora.release.verify import _check_attack_ceiling

FPRS = (0.001, 0.01, 0.1)


def _gaussian_tpr(mu: float, alpha: float) -> float:
    return float(norm.cdf(norm.ppf(alpha) + mu))


def _one_step_tpr(q: float, sigma: float, adjacency: Adjacency, alpha: float) -> float:
    """Exact ceiling of one Poisson-subsampled Gaussian step (max over both test directions)."""
    sf = norm.sf
    if adjacency is Adjacency.ADD_REMOVE:
        p0 = lambda t: sf(t / sigma)  # noqa: E731  (without the unit)
        p1 = lambda t: (1 - q) * sf(t / sigma) + q * sf((t - 1) / sigma)  # noqa: E731  (with it)
        forward = p1(brentq(lambda t: p0(t) - alpha, -60, 60, xtol=1e-14))
        backward_t = brentq(lambda t: (1 - p1(t)) - alpha, -60, 60, xtol=1e-14)
        return max(forward, 1 - p0(backward_t))
    p0 = lambda t: (1 - q) * sf(t / sigma) + q * sf((t + 1) / sigma)  # noqa: E731
    p1 = lambda t: (1 - q) * sf(t / sigma) + q * sf((t - 1) / sigma)  # noqa: E731
    return p1(brentq(lambda t: p0(t) - alpha, -60, 60, xtol=1e-14))


# ---------------------------------------------------------------------------------------------- findings


def test_finding_attached_private_audit_ceiling_ignores_the_audit_run():
    """After ``dplora audit --attach`` of a private-data audit, the record claims release + audit composed, but its
    attack ceiling (card sentence and verify's recomputation) is the release run's alone: an attacker holding the
    record (adapter + the audit section's outputs from a second run on the same units) can beat it.

    Both runs: q = 1, σ = 2, T = 4, add/remove, so each is μ = 1 Gaussian DP and together μ = √2 (exact).
    """
    event = DpSgdEvent(sample_rate=1.0, noise_multiplier=2.0, steps=4)
    eps = exact_epsilon(event, 1e-5, 4)
    record = {
        "mechanism": {**event.to_dict(), "max_grad_norm": 1.0},
        "privacy": {"protected_unit": "user", "adjacency": "add_remove"},
        "accounting": {
            "epsilon_spent": eps,
            "delta": 1e-5,
            "sample_rate": 1.0,
            "noise_multiplier": 2.0,
            "steps_done": 4,
            "accountant": "rdp",
        },
        "attack_ceiling": ceiling_entry(event, use_cache=False),
    }
    section = {
        "data": {"source": "private"},
        "claimed_epsilon": eps,
        "mechanism": {"delta": 1e-5, "sample_rate": 1.0, "noise_multiplier": 2.0, "steps": 4, "accountant": "rdp"},
    }
    composed = composed_claim(record, section)
    assert composed is not None and composed["total_epsilon"] > eps  # the record does claim the composition
    attached = {**record, "audit": {**section, "composed": composed}}
    truth = _gaussian_tpr(math.sqrt(2.0), 0.01)  # 0.1813: two μ = 1 runs on the same units
    card = _ceiling(attached)
    stated = float(re.search(r"exceed ([0-9.]+) % true positives at 1 %", card).group(1)) / 100
    recomputed, _ = _check_attack_ceiling(attached)
    assert stated >= truth - 1e-3, f"card states {stated:.4f} at 1 % FPR; the record's mechanisms allow {truth:.4f}"
    assert recomputed["true_positive_rate_at"]["1%"] >= truth - 1e-4


def test_finding_nan_profile_gives_the_most_optimistic_ceiling():
    """``tradeoff_tpr`` on a profile dp_accounting returned as NaN (``_profile`` silences all numpy errors) states
    TPR = α, 'no test beats guessing', instead of refusing or 1.0; ``ceiling_entry`` catches only exceptions."""
    got = tradeoff_tpr(np.full(3, np.nan), np.array([0.0, 1.0, 2.0]), 0.01)
    assert got == 1.0


def test_finding_nan_held_out_scores_hide_a_ceiling_violation():
    """Every inserted canary scores 5 (TPR 1.0 at every FPR, far above the ceiling 0.09 at 1 %); held-out canaries
    scoring NaN (a diverged adapter: inf − inf) make the threshold NaN, TPR 0 and no violation (not exit 5)."""
    event = DpSgdEvent(sample_rate=1.0, noise_multiplier=2.0, steps=4)
    n = 1000
    inserted = [True] * n + [False] * n
    clean = ceiling_comparison([5.0] * n + [0.0] * n, inserted, event)
    assert clean["exceeded"]  # the same attack on finite scores fails the audit
    nan = ceiling_comparison([5.0] * n + [float("nan")] * n, inserted, event)
    assert nan["exceeded"] or any(p["tpr"] == 1.0 for p in nan["points"])


# ---------------------------------------------------------------------------------------------- held


@pytest.mark.parametrize("adjacency", list(Adjacency))
@pytest.mark.parametrize(("sigma", "steps"), [(1.0, 1), (2.0, 4), (0.5, 1), (5.0, 100)])
@pytest.mark.parametrize("interval", [1e-2, 1e-3])
def test_held_q1_ceiling_is_above_the_exact_gaussian_curve(adjacency, sigma, steps, interval):
    event = DpSgdEvent(sample_rate=1.0, noise_multiplier=sigma, steps=steps, adjacency=adjacency)
    scale = 2.0 if adjacency is Adjacency.REPLACE_ONE else 1.0
    got = _computed(event, interval, FPRS)
    for alpha, tpr in zip(FPRS, got, strict=True):
        exact = _gaussian_tpr(scale * math.sqrt(steps) / sigma, alpha)
        assert exact - 1e-9 <= tpr <= exact + 2e-3


@pytest.mark.parametrize("adjacency", list(Adjacency))
@pytest.mark.parametrize(("q", "sigma"), [(0.01, 0.6), (0.5, 0.3), (0.9, 1.0), (0.999, 3.0)])
def test_held_one_step_ceiling_at_the_coarsest_interval_is_above_the_exact_curve(adjacency, q, sigma):
    event = DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=1, adjacency=adjacency)
    got = _computed(event, 1e-2, FPRS)
    for alpha, tpr in zip(FPRS, got, strict=True):
        exact = _one_step_tpr(q, sigma, adjacency, alpha)
        assert exact - 1e-9 <= tpr <= exact + 0.02  # upper side: tightness only


@pytest.mark.parametrize("how", ["hardlink", "symlink"])
def test_finding_power_check_runs_noiseless_on_a_second_name_for_the_private_file(
    tmp_path, tiny_model_dir, tickets_csv, how
):
    """The rule "the power check never trains on the private data" is enforced by comparing resolved paths only: a
    hard link of the private file passes as --power-data, and the noiseless control then trains on the private units
    (its ε̂, AUC and TPRs go into audit.json). Called at the refusal point, before any training. A byte copy is no
    longer refused: comparing contents made the exit code an equality oracle on the private file; the report says
    that such a copy voids the guarantee (tests/audit/test_audit_power_cli.py)."""
    import os

    from conftest import contract_dict, write_contract

    from dplora.audit.runner import DataSource
    from dplora.cli.audit import _power_contract
    from dplora.contract.loader import load_contract
    from dplora.errors import BadInputError

    cfg = write_contract(tmp_path / "a.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp_path / "o"))
    contract = load_contract(cfg, [])
    second = tmp_path / "public.csv"
    os.link(tickets_csv, second) if how == "hardlink" else second.symlink_to(tickets_csv)
    with pytest.raises(BadInputError):
        _power_contract(cfg, [], contract, DataSource.PRIVATE, tmp_path / "o-audit", True, second)


def test_finding_verify_line_calls_an_older_200_canary_audit_no_violation():
    """An audit section attached before issue 46/49 (no ``verdict``/``informative`` keys, but its ``canaries`` count
    is there) is summarised by ``dplora verify`` as "no violation", not "uninformative", though it has 200 < 1,000
    canaries (issue 49: such audits report uninformative rather than pass)."""
    from dplora.audit.attach import summary_line

    older = {
        "epsilon_lower_bound": 0.4,
        "claimed_epsilon": 8.0,
        "confidence": 0.95,
        "violation": False,
        "canaries": 200,
        "inserted": 100,
        "guesses": 50,
        "correct": 30,
        "data": {"source": "surrogate"},
        "ledger": {},
        "attached_at": "2026-11-30T10:00:00Z",
    }
    line = summary_line(older)
    assert "uninformative" in line and "no violation;" not in line, line


@pytest.mark.parametrize("sigma", [2.214, 8.2])
def test_finding_plain_words_ceiling_rounds_down(sigma):
    """The card, ``verify`` and ``budget`` state the ceiling as "no test ... can exceed X %" with X rounded to the
    nearest 0.1 %: at q = 1, T = 1, σ = 8.2 (exact μ = 1/8.2) the ceiling at 0.1 % FPR is 0.1497 % and the sentence
    says 0.1 % (a third lower, 'no better than guessing'); at σ = 2.214 the 1 % ceiling 3.042 % reads 3.0 %."""
    from dplora.accounting.ceiling import ceiling_sentence

    event = DpSgdEvent(sample_rate=1.0, noise_multiplier=sigma, steps=1)
    said = ceiling_sentence(ceiling_entry(event, use_cache=False))
    one = float(re.search(r"exceed ([0-9.]+) % true positives at 1 %", said).group(1)) / 100
    tenth = float(re.search(r"([0-9.]+) % at 0\.1 %", said).group(1)) / 100
    assert one >= _gaussian_tpr(1 / sigma, 0.01), said
    assert tenth >= _gaussian_tpr(1 / sigma, 0.001), said
