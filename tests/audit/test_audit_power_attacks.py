"""Attacks on the audit's power and its summary (dplora.audit): held-out scores that are NaN, a second name for the
private file given as --power-data, and an older audit section's one-line summary."""

from __future__ import annotations

import pytest

from dplora.accounting.events import DpSgdEvent
from dplora.audit.power import ceiling_comparison


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
    from dplora.cli.audit import power_contract
    from dplora.contract.loader import load_contract
    from dplora.errors import BadInputError

    cfg = write_contract(tmp_path / "a.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp_path / "o"))
    contract = load_contract(cfg, [])
    second = tmp_path / "public.csv"
    os.link(tickets_csv, second) if how == "hardlink" else second.symlink_to(tickets_csv)
    with pytest.raises(BadInputError):
        power_contract(cfg, [], contract, DataSource.PRIVATE, tmp_path / "o-audit", True, second)


def test_finding_verify_line_calls_an_older_200_canary_audit_no_violation():
    """An audit section attached by an older dplora (no ``verdict``/``informative`` keys, but its ``canaries`` count
    is there) is summarised by ``dplora verify`` as "no violation", not "uninformative", though it has 200 < 1,000
    canaries (such audits report uninformative rather than pass)."""
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
