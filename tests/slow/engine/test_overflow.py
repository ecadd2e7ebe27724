"""The slow tier of tests/engine/test_overflow.py, whose docstring describes the module."""

from __future__ import annotations

import json
import math

import pytest
import torch
from support.overflow import C
from tiny import byte_tokenizer, save_tiny_model, tiny_llama

from dplora.contract.loader import parse_contract
from dplora.errors import TrainingFailedError
from dplora.mechanism import optimizer as dpopt
from dplora.recipe.config import RunOptions
from dplora.recipe.train import run_training

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
