"""Red team of issue 41 (with issue 49's lines): inputs on which the stated guarantee does not hold.

Each test states the guarantee it checks and fails on the code as of the red team (branch redteam41, from main
d0874ff). None of them uses real TWCS text: the files are hand-built.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest
import torch

from dplora.data.twcs import load_twcs_conversations, load_twcs_pairs
from dplora.errors import BadInputError
from dplora.mechanism.clipping import UnitClipAccumulator

C = 1.0
HEADER = ["tweet_id", "author_id", "inbound", "created_at", "text", "response_tweet_id", "in_response_to_tweet_id"]


def _at(second: int) -> str:
    return f"Tue Oct 31 22:10:{second:02d} +0000 2017"


def _twcs(path: Path, rows: list[list[str]]) -> Path:
    """A TWCS csv written by the csv module (every field quoted as needed, as pandas does)."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(HEADER)
        writer.writerows(rows)
    return path


# Customer 111 and the brand's answer: the records that must not depend on anyone else.
CUSTOMER_A = [
    ["1", "111", "True", _at(1), "@Brand my parcel is late", "2", ""],
    ["2", "Brand", "False", _at(2), "@111 sorry, we will look", "", "1"],
]


# --- 1. The overflow rule: a unit of finite records whose SUM overflows poisons the whole clipped sum ----------------


def _others(rows: torch.Tensor, ids: torch.Tensor, skip: int) -> torch.Tensor:
    """Brute force: Σ over units u != skip of min(1, C/(‖v_u‖ + 1e-6)) v_u (float64)."""
    total = torch.zeros(rows.shape[1], dtype=torch.float64)
    for u in sorted(set(ids.tolist()) - {skip}):
        v = rows[ids == u].double().sum(0)
        total += v * min(1.0, C / (float(v.norm()) + 1e-6))
    return total


@pytest.mark.parametrize("split", [False, True], ids=["one-physical-batch", "unit-split-across-batches"])
def test_finite_rows_whose_unit_sum_overflows_stay_bounded_by_c(split):
    """Guarantee (clipping.py, issue 41.4): each unit contributes min(1, C/‖v_u‖)·v_u, so one unit moves the
    clipped sum by at most C, and a record's overflow never reaches the noisy update. Attack: unit 1 has two
    records whose gradient rows are each finite (2e38 < fp32 max, row sums finite, so neither is zeroed) but whose
    unit vector v_1 overflows to inf; its clip factor is 0 and 0·inf = NaN. The clipped sum becomes NaN in that
    coordinate, the noisy update is NaN, the next step stops the run ("non-finite parameter", exit 4): one unit
    decides the exit code, and the other units' contribution is lost. Found: total[0] is NaN (both paths)."""
    g = torch.tensor([[0.3, 0.4, 0.0], [2e38, 0.0, 0.0], [2e38, 0.0, 0.0], [0.0, 0.6, 0.8]])
    ids = torch.tensor([0, 1, 1, 2])
    assert torch.isfinite(g.sum(dim=1)).all()  # every row is finite: nothing for the overflow rule to zero
    acc = UnitClipAccumulator(3, C, "cpu")
    if split:
        acc.add(g[:2].clone(), ids[:2], last_unit_continues=True)
        acc.add(g[2:].clone(), ids[2:])
    else:
        acc.add(g.clone(), ids)
    total, _ = acc.finish()
    assert torch.isfinite(total).all(), f"clipped sum {total.tolist()}"
    assert float((total.double() - _others(g, ids, skip=1)).norm()) <= C + 1e-6  # unit 1 moved it by <= C


def test_finite_rows_whose_unit_sum_overflows_under_normalize_stay_bounded():
    """The same under ``privacy.clipping: normalize`` (factor C/(‖v‖ + γ) = 0 at ‖v‖ = inf, 0·inf = NaN)."""
    g = torch.tensor([[3e38, -3e38], [3e38, -3e38], [0.6, 0.8]])  # row sums are 0: finite, never zeroed
    acc = UnitClipAccumulator(2, C, "cpu", normalize_gamma=0.01)
    acc.add(g.clone(), torch.tensor([0, 0, 1]))
    total, _ = acc.finish()
    assert torch.isfinite(total).all(), f"clipped sum {total.tolist()}"


# --- 2. TWCS: one customer's own tweet text decides whether anyone's records exist ---------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="known limit (docs/sharp_edges.md, TWCS input dplora cannot classify): a tweet whose text holds a line "
    "that looks like a TWCS row is refused for the whole file, since a quote left open there would move other "
    "customers' tweets into it; a one-unit bad-input refusal, exit 2",
)
@pytest.mark.parametrize("load", [load_twcs_conversations, load_twcs_pairs], ids=["conversations", "pairs"])
def test_another_customers_tweet_text_does_not_refuse_my_records(tmp_path, load):
    """Guarantee (issue 41.1): a customer's records are a function of that customer's own tweets and public inputs.
    Attack: customer 222 posts a valid two-line tweet whose second line reads like a TWCS row ("5,6,x,True,fine";
    written by csv as a quoted cell, as pandas writes it). With 222 in the file prepare-twcs refuses the whole file
    (exit 2, "data row 3's text holds a line shaped like a TWCS row"); without 222, customer 111's record is written.
    So 111's output (and the exit code of prepare-twcs, and of every run that follows) is decided by 222's text:
    the same class as the "refusal decided by one unit" row of sharp_edges.md. Found: BadInputError with 222."""
    b = [["3", "222", "True", _at(3), "@Brand my order list:\n5,6,x,True,fine", "", ""]]
    without = load(_twcs(tmp_path / "without.csv", CUSTOMER_A))
    assert [r["customer_id"] for r in without] == ["111"]
    try:
        with_b = load(_twcs(tmp_path / "with.csv", CUSTOMER_A + b))
    except BadInputError as err:
        pytest.fail(f"customer 222's tweet text refused the file: {err}")
    assert [r for r in with_b if r["customer_id"] == "111"] == without


# --- 3. TWCS: an invisible format character the normaliser misses keeps another customer's @id --------------------


@pytest.mark.parametrize(
    "invisible",
    ["\u2066", "\u2069", "\u061c", "\u034f", "\ufe0f", "\U000e0020"],
    ids=["LRI", "PDI", "ALM", "CGJ", "VS16", "TAG-SPACE"],
)
@pytest.mark.parametrize("load", [load_twcs_conversations, load_twcs_pairs], ids=["conversations", "pairs"])
def test_an_invisible_character_after_the_at_does_not_keep_another_customers_id(tmp_path, load, invisible):
    """Guarantee (twcs.py, docs/data_formats.md): texts are normalised 'with invisible format characters removed,
    so no lookalike @ hides an id from MENTION'; every @id of anyone but the unit's customer and the brands becomes
    @customer. Attack: the brand's answer to 111 writes '@<U+2066>222' (a bidi isolate: Cf, invisible; also U+2069,
    U+061C, the combining grapheme joiner U+034F, a variation selector, a tag character). INVISIBLE lists only
    U+00AD, U+180E, U+200B-U+200F, U+202A-U+202E, U+2060-U+2064, U+FEFF, and none of these is a word character, so
    MENTION does not match and customer 222's id stays, rendered '@222', in customer 111's record. Found: kept."""
    rows = [CUSTOMER_A[0], ["2", "Brand", "False", _at(2), f"@111 we also helped @{invisible}222 today", "", "1"]]
    out = load(_twcs(tmp_path / "t.csv", rows))
    text = out[0]["messages"][1]["content"] if "messages" in out[0] else out[0]["reply"]
    assert "222" not in text, repr(text)


# --- 4. A run stopped at step k by the DP stop rule, then replaced with --overwrite, is charged fewer than k steps ---


@pytest.mark.parametrize("then", ["overwrite", "resume"])
def test_a_run_stopped_at_step_k_stays_charged_k_steps(tmp_path, tiny_model_dir, signing_key, monkeypatch, then):
    """Guarantee (issue 49, docs/sharp_edges.md overflow row): 'a run that stops at step k for any reason is charged
    k steps'. Attack: the noisy update of step 3 is NaN (a DP output: the only stop rule), so the run stops with
    exit 4 and publishes 'non-finite parameter after step 3' (a function of 3 noisy steps). Its only resume
    checkpoint is the one written before step 1 (training.checkpoint_every unset: about every 10 minutes). Running
    again with --overwrite discards that checkpoint and settles the pending charge 'at the ε of the checkpoint's
    steps' (RunCharge.settle_discarded): ε(0) = 0, not ε(3). (With --resume instead, steps 1..3 are run again
    under the one reservation of T steps: T + 3 noisy steps of the same data under a charge of T.)
    Found: the failed run's ledger charge is settled at ε = 0 (overwrite); the resumed run's charge holds T = 8 steps
    (resume)."""
    import yaml

    from dplora.contract.loader import parse_contract
    from dplora.errors import TrainingFailedError
    from dplora.ledger.store import Ledger, default_ledger_path
    from dplora.mechanism import optimizer as dpopt
    from dplora.recipe.config import RunOptions
    from dplora.recipe.train import run_training

    monkeypatch.setenv("DPLORA_LEDGER", str(tmp_path / "ledger.sqlite3"))  # this test's own ledger
    csv_path = tmp_path / "data.csv"
    csv_path.write_text("text\n" + "".join(f"record {i} asks about order {1000 + i}\n" for i in range(8)))
    raw = {
        "privacy": {
            "protected_unit": "row",
            "adjacency": "add_remove",
            "target_epsilon": 50.0,
            "delta": 1e-5,
            "accountant": "rdp",
            "max_grad_norm": 1.0,
            "noise_multiplier": 1.0,
            "num_units": 8,
        },
        "model": {"path": str(tiny_model_dir)},
        "data": {"path": str(csv_path), "text_column": "text"},
        "lora": {"r": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]},
        "training": {
            "expected_batch_size": 4,
            "physical_batch_size": 4,
            "steps": 8,
            "lr": 0.05,
            "optimizer": "sgd",
            "max_seq_len": 24,
            "output_dir": str(tmp_path / "run"),
        },
    }
    contract = parse_contract(yaml.safe_load(yaml.safe_dump(raw)))
    real, calls = dpopt.privatize, []

    def nan_at_step_3(clipped_sum, **kw):
        calls.append(1)
        out = real(clipped_sum, **kw)
        return out * float("nan") if len(calls) == 3 else out

    monkeypatch.setattr(dpopt, "privatize", nan_at_step_3)
    opts = RunOptions(signing_key=signing_key[0], data_key=None, progress=False, threads=1)
    with pytest.raises(TrainingFailedError, match="after step 3"):
        run_training(contract, opts, log=print)
    with Ledger(default_ledger_path(), create=False) as ledger:
        (failed,) = [c for c in ledger.unassigned() if c.status == "pending"]  # this test's run (a shared ledger)
    monkeypatch.setattr(dpopt, "privatize", real)
    if then == "resume":  # fixed: refused (redoing steps 1..3 would spend more than the charge of T steps)
        from dplora.errors import BadInputError

        with pytest.raises(BadInputError, match=r"took 3 steps but its last checkpoint holds [0-2]\b"):
            run_training(contract, dataclasses.replace(opts, resume=True), log=print)
        with Ledger(default_ledger_path(), create=False) as ledger:
            assert ledger.charge(failed.run_id).status == "pending"  # still held at its reservation of T steps
        return
    result = run_training(contract, dataclasses.replace(opts, **{then: True}), log=print)
    with Ledger(default_ledger_path(), create=False) as ledger:
        settled = ledger.charge(failed.run_id)
    stopped_at = result.plan.epsilon_at(3)
    assert settled.status == "failed"
    assert float(settled.epsilon) >= stopped_at - 1e-9, f"charged ε={settled.epsilon}, 3 steps are ε={stopped_at}"


# --- 5. A longer record zeroes a shorter one through the padding (a non-finite pad embedding) -----------------------


def test_a_neighbours_length_does_not_zero_my_record_through_padding():
    """Guarantee (batch.py, issue 41.4): 'the padding width changes nothing'; a record's overflow contributes zero
    for THAT record only. Attack: a public base whose <pad> embedding row is non-finite (an untrained or overflowed
    row; every real token's row is finite). In one physical batch with a longer record j, record i is right-padded:
    attention multiplies the pad keys' NaN values by their zero weights (0·NaN = NaN), so i would be zeroed because
    of j's length (two units move). Fixed: such a base model is refused before any data is read (a fact about the
    public model), so no run ever batches records through a NaN pad embedding."""
    from tiny import byte_tokenizer, tiny_llama

    from dplora.engine.lora import check_pad_embedding as _check_pad_embedding
    from dplora.errors import BadInputError

    model, tok = tiny_llama(), byte_tokenizer()
    _check_pad_embedding(model, tok)  # a finite pad row passes
    with torch.no_grad():
        model.get_input_embeddings().weight[tok.pad_token_id] = float("nan")
    with pytest.raises(BadInputError, match="padding token"):
        _check_pad_embedding(model, tok)
