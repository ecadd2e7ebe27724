"""The planner (issue 29): its choice is the rule's, within ε for every candidate, and blind to private counts."""

from __future__ import annotations

import math

import pytest
from support.planner import ARGS, auto

from dplora.accounting.calibration import calibrate
from dplora.contract.loader import parse_contract
from dplora.errors import BadInputError, PlanRefusedError
from dplora.plan.planner import batch_options, epoch_options, recommend, scaled_lr


def test_an_unreachable_target_is_refused():
    with pytest.raises(PlanRefusedError, match="no eligible batch"):
        recommend(**(ARGS | {"num_units": 100, "target_epsilon": 1e-4}), lr_ref=1e-3)


@pytest.mark.parametrize(("n", "batch", "steps"), [(50, 32, 5), (100, 32, 10), (534, 32, 51), (5000, 256, 59)])
def test_small_and_large_populations_plan_at_the_default_epochs(n, batch, steps):
    """E 3 (what `dplora init` writes) plans for every N ≥ 50: below N ≈ 534 no B ≥ 32 reaches T 50, and the floor
    falls to the most steps any candidate reaches (B 32) instead of refusing."""
    rec = recommend(**(ARGS | {"num_units": n, "delta": 1 / (10 * n)}), lr_ref=2e-3)
    assert (rec.choice.expected_batch_size, rec.choice.steps) == (batch, steps)
    assert rec.to_dict()["inputs"]["min_steps"] == min(50, math.ceil(3 * n / 32))
    assert rec.choice.epsilon <= 8.0


def test_q_one_is_an_eligible_candidate_at_n_554_and_the_gaussian_mechanism():
    rec = recommend(**(ARGS | {"num_units": 554, "accountant": "pld"}), lr_ref=2e-3, epochs=50)
    full = [c for c in rec.candidates if c.expected_batch_size == 554]
    assert len(full) == 1 and full[0].excluded is None and full[0].sample_rate == 1.0 and full[0].steps == 50
    assert rec.choice.expected_batch_size == 554  # the smallest σ/B: every unit in every step


@pytest.mark.parametrize(
    ("num_units", "epsilon", "max_epochs", "weighed_at"),
    [
        # the front of (larger q, fewer T): B 512 at E 20 (T 63) and B 96 at E 3 (T 50, fewer steps)
        (1600, 8.0, 20, [(3.0, 96), (20.0, 512)]),
        # small ε, a cap off the grid: σ/B follows T, and B 48 at E 3 (T 50) beats B 96 at E 7 (T 58); a search that
        # stopped once σ/B rose from a larger E never reached it
        (785, 0.5, 7, [(3.0, 48), (7.0, 96)]),
    ],
)
def test_epochs_auto_calibrates_only_the_front_and_chooses_the_smallest_sigma_over_b(
    num_units, epsilon, max_epochs, weighed_at
):
    rec = recommend(**(ARGS | {"num_units": num_units, "target_epsilon": epsilon}), lr_ref=2e-3, max_epochs=max_epochs)
    table = rec.to_dict()
    assert table["inputs"]["max_epochs"] == max_epochs and table["inputs"]["epoch_grid"][:3] == [1, 2, 3]
    weighed = [c for c in rec.candidates if c.noise_multiplier is not None]
    assert [(c.epochs, c.expected_batch_size) for c in weighed] == weighed_at
    assert all(
        c.excluded is None or "below the minimum" in c.excluded or "not weighed: dominated by" in c.excluded
        for c in rec.candidates
    )
    # brute force over every (B, E) with T ≥ the floor: the choice is the smallest σ/B
    best = None
    for e in epoch_options(None, max_epochs):
        for b in batch_options(num_units):
            t = math.ceil(e * num_units / b)
            if t < rec.min_steps:
                continue
            sigma, _ = calibrate(
                target_epsilon=epsilon,
                sample_rate=b / num_units,
                steps=t,
                delta=1e-5,
                accountant="rdp",
                adjacency="add_remove",
            )
            best = min(best or (math.inf,), (sigma / b, -t, b, float(e)))
    assert (rec.choice.expected_batch_size, rec.choice.epochs) == (best[2], best[3])
    assert rec.choice.noise_per_unit == pytest.approx(best[0], rel=1e-12)


def test_scaled_lr_sqrt():
    assert scaled_lr(1e-3, 128) == pytest.approx(2e-3)


def test_auto_contract_validation(tmp_path, tiny_model_dir, tickets_csv):
    raw = auto(tmp_path, tiny_model_dir, tickets_csv)
    assert parse_contract(raw).training.is_auto
    raw["training"]["expected_batch_size"] = 8
    with pytest.raises(BadInputError, match="steps: auto needs"):
        parse_contract(raw)


@pytest.mark.parametrize(
    ("given", "schedule", "warmup", "source"),
    [
        ({}, "constant", 0, "planner"),
        ({"lr_schedule": "cosine"}, "cosine", 0, "contract"),
        ({"warmup_steps": 3}, "constant", 3, "contract"),
        ({"lr_schedule": "linear", "warmup_steps": 2}, "linear", 2, "contract"),
    ],
)
def test_the_recorded_schedule_is_the_one_that_runs(tmp_path, tiny_model_dir, given, schedule, warmup, source):
    """`auto` with a schedule or warmup set by hand: the run uses them and the planner's table (released as
    optimization.planner) says so, never the planner's default beside them."""
    from dplora.plan.resolve import resolve_auto

    raw = auto(tmp_path, tiny_model_dir, tmp_path / "missing.csv", epochs=3, **given)
    resolved, rec = resolve_auto(parse_contract(raw))
    t = resolved.training.model_dump(mode="json")
    table = rec.to_dict()
    assert (t["lr_schedule"], t["warmup_steps"]) == (schedule, warmup)
    assert (table["lr_schedule"], table["warmup_steps"], table["schedule_source"]) == (schedule, warmup, source)
    assert table["choice"]["expected_batch_size"] == t["expected_batch_size"] == 48


def test_a_candidate_whose_epsilon_closed_well_under_the_target_rules_nothing_out(monkeypatch):
    """A calibration that closed on a jump in the checked ε (an accountant's range limit) leaves ε well under the
    target; its σ/B says nothing about the candidates it dominates, so they are weighed and may win."""
    import dplora.plan.planner as planner

    def fake(*, sample_rate, steps, target_epsilon, **_):  # B 8192 stuck at a jump: ε 0.9 of the target
        batch = round(sample_rate * 1_000_000)
        sigma = {8192: 14.3, 6144: 10.6}.get(batch, 0.002 * batch)  # σ/B 0.00175, 0.00173, else 0.002
        return sigma, (0.9 if batch == 8192 else 0.996) * target_epsilon

    monkeypatch.setattr(planner, "calibrate", fake)
    args = ARGS | {"num_units": 1_000_000, "target_epsilon": 1.0}
    rec = recommend(**args, lr_ref=2e-3, epochs=1000, max_steps=59_500)  # every B at T 59,500: one front at a time
    weighed = [c.expected_batch_size for c in rec.candidates if c.noise_multiplier is not None]
    assert weighed == [6144, 8192] and rec.choice.expected_batch_size == 6144
    assert all("dominated by B=6144" in c.excluded for c in rec.candidates if c.expected_batch_size < 6144)
