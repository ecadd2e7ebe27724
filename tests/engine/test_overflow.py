"""Issue 41.4 (with issue 49's line): a record's overflow is a zero contribution, not a failure.

A record whose loss or per-example gradient is non-finite contributes ZERO to its unit's vector; its row is replaced
after it is formed (a NaN times a zero weight is still NaN); the unit is still counted, clipped and summed; noise
and the accountant step happen as usual; the count of zeroed records is private. Only a non-finite *noisy* update
(a DP output) stops the run, and a run that stops at step k is charged k steps.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from tiny import byte_tokenizer, save_tiny_model, tiny_llama

from dplora.contract.loader import parse_contract
from dplora.errors import TrainingFailedError
from dplora.mechanism import optimizer as dpopt
from dplora.mechanism.clipping import UnitClipAccumulator
from dplora.recipe.config import RunOptions
from dplora.recipe.train import run_training

C = 1.0


def _clipped(rows: list[torch.Tensor]) -> torch.Tensor:
    """Brute force: Σ_u min(1, C/(‖v_u‖ + 1e-6)) v_u over units given as lists of rows."""
    total = torch.zeros_like(rows[0][0])
    for unit in rows:
        v = torch.stack(unit).sum(0)
        total += v * min(1.0, C / (float(v.norm()) + 1e-6))
    return total


@pytest.mark.parametrize("grouped", [False, True], ids=["row-level", "units-with-several-records"])
def test_a_non_finite_row_contributes_zero_and_its_unit_still_counts(grouped):
    g = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([0, 1, 1, 2, 3, 3]) if grouped else torch.arange(6)
    bad = g.clone()
    bad[1, 2] = float("nan")  # an overflow in one coordinate of record 1
    bad[4] = float("inf")  # every coordinate of record 4
    acc = UnitClipAccumulator(5, C, "cpu")
    acc.add(bad, ids)
    total, norms = acc.finish()
    zeroed = g.clone()
    zeroed[[1, 4]] = 0.0
    units = [[zeroed[i] for i in range(6) if int(ids[i]) == u] for u in sorted(set(ids.tolist()))]
    assert torch.allclose(total, _clipped(units), atol=1e-6)
    assert torch.isfinite(total).all() and int(acc.zeroed) == 2
    assert acc.units == len(units) and len(norms) == len(units)  # every unit counted, the zeroed ones too


def test_a_non_finite_loss_flag_zeroes_a_finite_row_and_mean_weights_stay_per_unit():
    """``finite_rows`` False zeroes a row whose gradient is finite; under unit_clipping: mean the unit's weights
    stay 1/records (the zeroed record still counts in its unit's size: a public-shape rule, not data-dependent)."""
    g = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    ids, w = torch.tensor([0, 0, 1, 1]), torch.full((4,), 0.5)
    acc = UnitClipAccumulator(3, C, "cpu")
    acc.add(g.clone(), ids, row_weight=w, finite_rows=torch.tensor([True, False, True, True]))
    total, _ = acc.finish()
    expected = _clipped([[0.5 * g[0], torch.zeros(3)], [0.5 * g[2], 0.5 * g[3]]])
    assert torch.allclose(total, expected, atol=1e-6) and int(acc.zeroed) == 1


def test_a_unit_split_across_physical_batches_with_an_overflow():
    """The open row of a unit that spans two physical batches never takes in the NaN."""
    g = torch.randn(4, 3, generator=torch.Generator().manual_seed(2))
    bad = g.clone()
    bad[1] = float("nan")
    acc = UnitClipAccumulator(3, C, "cpu")
    acc.add(bad[:2], torch.tensor([0, 0]), last_unit_continues=True)
    acc.add(bad[2:], torch.tensor([0, 1]))
    total, _ = acc.finish()
    assert torch.allclose(total, _clipped([[g[0], torch.zeros(3), g[2]], [g[3]]]), atol=1e-6)


POISON = "\u00a4"  # "¤": two byte tokens; its second byte (0xA4) appears in no other record of these tests


def _poisoned_model(folder):
    """The tiny Llama with the embedding of byte 0xA4 set to NaN: a record holding "¤" gets a NaN loss."""
    model, tok = tiny_llama(), byte_tokenizer()
    poison_id = tok(POISON, add_special_tokens=False)["input_ids"][-1]
    with torch.no_grad():
        model.get_input_embeddings().weight[poison_id] = float("nan")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _contract(tmp_path, model_dir, *, batch: int = 6, **privacy):
    rows = [f"record {i} asks about order {1000 + i}" for i in range(8)]
    rows[3] = f"record 3 pays {POISON}40 for order 1003"
    csv = tmp_path / "data.csv"
    csv.write_text("customer,text\n" + "".join(f"c{i // 2},{t}\n" for i, t in enumerate(rows)))
    raw = {
        "privacy": {
            "protected_unit": "row",
            "adjacency": "add_remove",
            "target_epsilon": 50.0,
            "delta": 1e-5,
            "accountant": "rdp",
            "max_grad_norm": C,
            "noise_multiplier": 1.0,
            "num_units": 8,
            **privacy,
        },
        "model": {"path": str(model_dir)},
        "data": {"path": str(csv), "text_column": "text"},
        "lora": {"r": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]},
        "training": {
            "expected_batch_size": batch,
            "physical_batch_size": 3,
            "steps": 12,
            "lr": 0.05,
            "optimizer": "sgd",
            "max_seq_len": 24,
            "output_dir": str(tmp_path / "run"),
        },
    }
    return parse_contract(raw)


@pytest.mark.parametrize(
    "privacy",
    [
        {},
        {"per_sample": "opacus"},
        {"protected_unit": "user", "unit_key": "customer", "num_units": 4, "unit_clipping": "mean"},
    ],
    ids=["fast-path", "opacus-path", "user-level-mean"],
)
def test_a_record_that_overflows_is_a_zero_contribution_not_a_failure(tmp_path, signing_key, privacy):
    """The run with a NaN-loss record finishes and releases at the planned T and ε (q = 0.75 for rows and for
    customers, T = 12: the record is sampled in all but (1/4)^12 of runs); the count of zeroed records is in the
    private report only."""
    model = _poisoned_model(tmp_path / "poisoned")
    contract = _contract(tmp_path, model, batch=3 if "num_units" in privacy else 6, **privacy)
    result = run_training(
        contract, RunOptions(signing_key=signing_key[0], data_key=None, progress=False, threads=1), log=print
    )
    assert result.release_path.is_file() and result.steps_done == 12
    assert result.epsilon_spent == pytest.approx(result.plan.epsilon_spent(12))
    report = json.loads((tmp_path / "run.private" / "report.json").read_text())
    assert report["records_zeroed"] >= 1
    assert "contributed zero" in (tmp_path / "run.private" / "train.log").read_text()
    predicate = (tmp_path / "run" / "release.dsse.json").read_text()
    assert "records_zeroed" not in predicate


def test_only_a_non_finite_noisy_update_stops_the_run_and_k_steps_are_charged(
    tmp_path, tiny_model_dir, signing_key, monkeypatch
):
    """A noisy update that is NaN (a DP output: the only stop rule) stops the run after step 1: exit 4, no release,
    FAILED.json charging exactly the 1 step taken."""
    contract = _contract(tmp_path, save_tiny_model(tmp_path / "clean"))
    real = dpopt.privatize
    calls = []

    def nan_update(clipped_sum, **kw):
        calls.append(1)
        return real(clipped_sum, **kw) * float("nan")

    monkeypatch.setattr(dpopt, "privatize", nan_update)
    with pytest.raises(TrainingFailedError, match="non-finite parameter after step 1") as info:
        run_training(
            contract, RunOptions(signing_key=signing_key[0], data_key=None, progress=False, threads=1), log=print
        )
    assert info.value.exit_code == 4 and len(calls) == 1
    failed = json.loads((tmp_path / "run.partial" / "FAILED.json").read_text())
    assert failed["steps_done"] == 1 and failed["release"].startswith("none")
    plan_eps = failed["epsilon_charged_upper_bound"]
    assert math.isfinite(plan_eps) and plan_eps > 0
    assert not (tmp_path / "run").exists()
