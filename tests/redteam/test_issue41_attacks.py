"""Red team of issue 41 (with issue 49's lines): inputs on which the stated guarantee does not hold.

Each test states the guarantee it checks and fails on the code as of the red team (branch redteam41, from main
d0874ff). None of them uses real TWCS text: the files are hand-built.
"""

from __future__ import annotations

import csv
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
