"""Tests of dplora.data.units: Poisson sampling over units, grouping records into units, tokenization (no torch).

References: the Binomial(N, q) moments of a Poisson-sampled batch, hand-built unit groupings, and the byte
count of the text for the byte-level tokenizer of tests/tiny.py (one token per UTF-8 byte).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import contract_records
from conftest import minimal_contract as _contract
from datasets import Dataset
from tiny import byte_tokenizer

from dplora.contract.spec import PrivacySection
from dplora.data.units import build_unit_index
from dplora.errors import BadInputError
from dplora.mechanism.sampling import PoissonUnitSampler

EOS = 257


def _privacy(unit: str = "ticket", key: str | None = "tid", cap: int | None = None) -> PrivacySection:
    return PrivacySection(
        protected_unit=unit,
        unit_key=key,
        adjacency="add_remove",
        target_epsilon=3.0,
        delta=1e-5,
        max_grad_norm=1.0,
        max_records_per_unit=cap,
    )


def test_batch_size_moments_match_binomial():
    """Batch sizes over 4000 draws: mean N·q and variance N·q(1−q) within 4 standard errors."""
    n, q, draws = 1000, 0.05, 4000
    sampler = PoissonUnitSampler(n, q, rng=np.random.default_rng(1234))
    sizes = np.array([len(sampler.sample()) for _ in range(draws)])
    mean, var = n * q, n * q * (1 - q)
    assert abs(sizes.mean() - mean) < 4 * math.sqrt(var / draws)
    # Var of the sample variance ≈ 2σ⁴/(draws−1) for a near-normal Binomial with N·q = 50.
    assert abs(sizes.var(ddof=1) - var) < 4 * var * math.sqrt(2 / (draws - 1))


def test_each_unit_included_with_probability_q():
    """Every unit's inclusion frequency over 3000 draws is q within 4.5 binomial standard errors."""
    n, q, draws = 200, 0.1, 3000
    sampler = PoissonUnitSampler(n, q, rng=np.random.default_rng(7))
    counts = np.zeros(n)
    for _ in range(draws):
        batch = sampler.sample()
        assert len(np.unique(batch)) == len(batch) and (batch >= 0).all() and (batch < n).all()
        counts[batch] += 1
    freq = counts / draws
    assert np.abs(freq - q).max() < 4.5 * math.sqrt(q * (1 - q) / draws)


def test_empty_batches_occur_at_rate_one_minus_q_to_the_n():
    """N=100, q=0.005: empty batches occur with frequency (1−q)^N ≈ 0.606 (4 standard errors)."""
    n, q, draws = 100, 0.005, 3000
    sampler = PoissonUnitSampler(n, q, rng=np.random.default_rng(3))
    empty = sum(len(sampler.sample()) == 0 for _ in range(draws)) / draws
    p = (1 - q) ** n
    assert abs(empty - p) < 4 * math.sqrt(p * (1 - p) / draws)


def test_rate_one_includes_everyone():
    """q=1 puts every unit in every batch."""
    sampler = PoissonUnitSampler(37, 1.0, rng=np.random.default_rng(0))
    for _ in range(5):
        assert sampler.sample().tolist() == list(range(37))


def test_unseeded_sampler_ignores_global_numpy_seed():
    """Without an rng, two samplers draw different batches even after np.random.seed(0) (OS entropy)."""
    runs = []
    for _ in range(2):
        np.random.seed(0)
        sampler = PoissonUnitSampler(1000, 0.5)
        runs.append([sampler.sample().tolist() for _ in range(3)])
    assert runs[0] != runs[1]


@pytest.mark.parametrize("q", [0.0, -0.1, 1.01, float("nan")])
def test_invalid_rate_rejected(q):
    """q must lie in (0, 1]."""
    with pytest.raises(ValueError):
        PoissonUnitSampler(10, q)


def test_ticket_key_groups_records_in_first_seen_order():
    """A unit key groups every record of a ticket; units are numbered in order of first appearance."""
    table = Dataset.from_dict({"text": list("abcdefg"), "tid": ["T1", "T2", "T1", "T3", "T2", "T1", "T4"]})
    index = build_unit_index(table, _privacy(), seed=0)
    assert [g.tolist() for g in index.records_of_unit] == [[0, 2, 5], [1, 4], [3], [6]]
    assert (index.num_units, index.num_records, index.dropped) == (4, 7, 0)


def test_user_key_with_integer_ids():
    """User-level grouping works on an integer id column (one unit per distinct id)."""
    table = Dataset.from_dict({"text": ["x"] * 6, "uid": [5, 9, 5, 5, 9, 1]})
    index = build_unit_index(table, _privacy("user", "uid"), seed=0)
    assert [g.tolist() for g in index.records_of_unit] == [[0, 2, 3], [1, 4], [5]]


def test_row_level_one_unit_per_row():
    """Row-level: record i is unit i, whatever other columns hold."""
    table = Dataset.from_dict({"text": list("abcde"), "tid": ["T1"] * 5})
    index = build_unit_index(table, _privacy("row", None), seed=0)
    assert [g.tolist() for g in index.records_of_unit] == [[0], [1], [2], [3], [4]]
    assert (index.num_units, index.num_records, index.dropped) == (5, 5, 0)


def test_empty_unit_id_rejected():
    """An empty or blank unit id is a BadInputError naming the column."""
    table = Dataset.from_dict({"text": ["a", "b"], "tid": ["T1", "  "]})
    with pytest.raises(BadInputError, match="tid"):
        build_unit_index(table, _privacy(), seed=0)


def test_cap_drops_records_by_seeded_rule():
    """max_records_per_unit: kept ⊆ unit, size = cap, dropped count = Σ excess; same seed → same choice."""
    tids = ["A"] * 6 + ["B"] * 2 + ["C"] * 4 + ["D"]
    table = Dataset.from_dict({"text": ["t"] * len(tids), "tid": tids})
    groups = [[0, 1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11], [12]]
    index = build_unit_index(table, _privacy(cap=3), seed=11)
    assert index.dropped == (6 - 3) + (4 - 3)
    assert index.num_records == 13 and index.num_units == 4
    assert index.records_before_cap == (6, 2, 4, 1)
    stats = index.stats()
    assert stats["dropped_by_cap"] == 4 and stats["records_per_unit"]["max"] == 6
    assert stats["max_records_per_unit_after_cap"] == 3
    for kept, full in zip(index.records_of_unit, groups, strict=True):
        assert len(kept) == min(3, len(full)) and set(kept.tolist()) <= set(full)
        assert kept.tolist() == sorted(kept.tolist())
    again = build_unit_index(table, _privacy(cap=3), seed=11)
    assert [g.tolist() for g in again.records_of_unit] == [g.tolist() for g in index.records_of_unit]
    choices = {tuple(build_unit_index(table, _privacy(cap=3), seed=s).records_of_unit[0]) for s in range(20)}
    assert len(choices) > 1  # the seed matters


def test_cap_keeps_each_record_with_equal_probability():
    """Over 400 seeds a 4-record unit capped at 2 keeps each record with frequency 1/2 (4 standard errors)."""
    table = Dataset.from_dict({"text": ["t"] * 4, "tid": ["A"] * 4})
    kept = np.zeros(4)
    seeds = 400
    for seed in range(seeds):
        kept[build_unit_index(table, _privacy(cap=2), seed=seed).records_of_unit[0]] += 1
    assert np.abs(kept / seeds - 0.5).max() < 4 * math.sqrt(0.25 / seeds)


class _Table:
    """The part of a ``datasets.Dataset`` that build_unit_index reads (fast for property tests)."""

    def __init__(self, columns: dict[str, list]):
        self.columns = columns
        self.num_rows = len(next(iter(columns.values())))
        self.column_names = list(columns)

    def __getitem__(self, name):
        return self.columns[name]


def _kept_by_unit(rows: list[tuple[str, str]], cap: int, seed: int) -> dict[str, list[str]]:
    """{unit id: its kept records' texts in file order} for rows of (unit id, text)."""
    table = _Table({"tid": [u for u, _ in rows], "text": [t for _, t in rows]})
    index = build_unit_index(table, _privacy(cap=cap), seed=seed)
    return {rows[int(g[0])][0]: [rows[int(i)][1] for i in g] for g in index.records_of_unit}


def test_cap_choice_of_a_unit_ignores_every_other_unit():
    """Property, 150 random tables: removing any one unit, or adding one, leaves every other unit's kept records
    (as contents, duplicates included) unchanged. Unit sizes 1–9, caps 1–4, texts from 3 letters (many identical
    records), units interleaved in file order, the added unit's records at random positions."""
    for trial in range(150):
        rng = np.random.default_rng(trial)
        units = [f"u{j}" for j in range(int(rng.integers(2, 7)))]
        rows = [(u, "".join(rng.choice(list("abc"), size=int(rng.integers(1, 3))))) for u in units]
        rows += [(str(rng.choice(units)), str(rng.choice(list("abcd")))) for _ in range(int(rng.integers(5, 30)))]
        rows = [rows[i] for i in rng.permutation(len(rows))]
        cap, seed = int(rng.integers(1, 5)), int(rng.integers(0, 2**63))
        full = _kept_by_unit(rows, cap, seed)
        assert all(len(k) == min(cap, sum(u == r[0] for r in rows)) for u, k in full.items())
        for gone in units:
            rest = _kept_by_unit([r for r in rows if r[0] != gone], cap, seed)
            assert rest == {u: k for u, k in full.items() if u != gone}, (trial, gone)
        added = list(rows)
        for _ in range(int(rng.integers(1, 9))):
            added.insert(int(rng.integers(0, len(added) + 1)), ("new", str(rng.choice(list("abc")))))
        more = _kept_by_unit(added, cap, seed)
        assert {u: k for u, k in more.items() if u != "new"} == full, trial


def test_cap_issue_case_removing_one_user_moves_no_other():
    """The reported case (datasets.Dataset): 4 users × 5 records, cap 2; removing user 0 changed the other three
    users' kept records for 20 of 20 seeds. Now: for every seed, the other users keep the same records."""
    tids = [f"user{u}" for _ in range(5) for u in range(4)]  # interleaved, as in a log file
    texts = [f"{t} message {i}" for i, t in enumerate(tids)]
    full_table = Dataset.from_dict({"text": texts, "tid": tids})
    keep = [i for i, t in enumerate(tids) if t != "user0"]
    less_table = Dataset.from_dict({"text": [texts[i] for i in keep], "tid": [tids[i] for i in keep]})
    for seed in range(20):
        full = build_unit_index(full_table, _privacy(cap=2), seed=seed)
        less = build_unit_index(less_table, _privacy(cap=2), seed=seed)
        kept_full = [sorted(texts[i] for i in g) for g in full.records_of_unit[1:]]
        kept_less = [sorted(texts[keep[i]] for i in g) for g in less.records_of_unit]
        assert kept_full == kept_less, seed


def test_cap_choice_follows_the_records_not_their_rows():
    """The same unit at other global rows, and its records in another order, keeps the same contents."""
    rows = [("A", t) for t in "pqrstuv"]
    kept = _kept_by_unit(rows, 3, 5)["A"]
    shifted = _kept_by_unit([("B", "x")] * 4 + rows[::-1], 3, 5)["A"]
    assert sorted(shifted) == sorted(kept)


def test_prompt_masked_and_eos_appended():
    """Prompt "hi\\n" (3 bytes) is masked with −100; the response bytes and EOS are the targets."""
    tok = byte_tokenizer()
    table = Dataset.from_dict({"message": ["hi", "héllo"], "reply": ["ok", "yes!"]})
    out = contract_records(table, tok, _contract(max_len=64))
    for (ids, labels), prompt, reply in zip(out, table["message"], table["reply"], strict=True):
        n_prompt, n_reply = len(f"{prompt}\n".encode()), len(reply.encode())
        assert len(ids) == len(labels) == n_prompt + n_reply + 1
        assert labels[:n_prompt] == [-100] * n_prompt
        assert labels[n_prompt:] == ids[n_prompt:]
        assert ids[-1] == EOS == tok.eos_token_id
        assert tok.decode(ids[:n_prompt]) == f"{prompt}\n" and tok.decode(ids[n_prompt:-1]) == reply


def test_long_pair_truncated_to_max_len_with_prompt_at_most_half():
    """A 100-byte prompt + 100-byte reply at max_seq_len 32: 16 masked prompt tokens, 16 target tokens."""
    tok = byte_tokenizer()
    table = Dataset.from_dict({"message": ["p" * 100, "q"], "reply": ["r" * 100, "s" * 50]})
    (ids, labels), (ids2, labels2) = contract_records(table, tok, _contract(max_len=32))
    assert len(ids) == len(labels) == 32
    assert labels[:16] == [-100] * 16 and -100 not in labels[16:]
    assert tok.decode(ids[:16]) == "p" * 16 and tok.decode(ids[16:]) == "r" * 16
    assert len(ids2) == 32 and labels2[:2] == [-100, -100] and tok.decode(ids2[2:]) == "s" * 30


def test_text_column_trains_every_token():
    """Text records: labels equal ids, EOS appended, truncated to max_seq_len."""
    tok = byte_tokenizer()
    table = Dataset.from_dict({"text": ["abc", "z" * 40]})
    (ids, labels), (ids2, labels2) = contract_records(table, tok, _contract(max_len=16, text=True))
    assert ids == labels and len(ids) == 4 and ids[-1] == EOS and tok.decode(ids[:3]) == "abc"
    assert ids2 == labels2 and len(ids2) == 16 and EOS not in ids2
