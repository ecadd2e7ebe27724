"""The public warm start with W = 2 processes (torchrun, gloo): every rank computes it on the same batches, and rank
0's warm-started adapters are what the ranks start the DP phase from and agree on.

Each rank works in its own folder holding its own copy of the relative ``data.path`` and of the relative public
file (as on two machines). Rank 1's public file holds OTHER rows than rank 0's: its own warm start then ends on other
adapters, so the run can only finish (the agreement check compares the ranks' adapter digests before the release)
if rank 0's warm-started adapters reach rank 1 before step 1. The record names rank 0's public file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from conftest import contract_dict, release_statement
from support.torchrun import train_on_two_ranks

from dplora.data.demo import write_tickets


def test_two_ranks_start_from_rank_0s_warm_start(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    dirs = [tmp_path / "rank0", tmp_path / "rank1"]
    for r, d in enumerate(dirs):
        d.mkdir()
        (d / "tickets.csv").write_bytes(tickets_csv.read_bytes())
        write_tickets(d / "public.csv", num_tickets=30, seed=500 + r)  # rank 1: other public rows
    public0 = (dirs[0] / "public.csv").read_bytes()
    assert public0 != (dirs[1] / "public.csv").read_bytes()
    out = tmp_path / "run"
    warm = {"path": "public.csv", "steps": 6, "batch_size": 4, "lr": 0.05}
    raw = contract_dict(
        tiny_model_dir,
        Path("tickets.csv"),
        out,
        data={"public_warm_start": warm},
        training={"steps": 2},
        privacy={"num_units": 120},
    )
    proc, codes = train_on_two_ranks(tmp_path, raw, dirs, signing_key)
    assert codes == [0, 0], (codes, proc.stderr[-2000:])
    assert proc.stderr.count("public warm start: 6 steps of 4 records from public.csv") == 1  # rank 0 logs
    record = release_statement(out)["predicate"]
    assert record["public_warm_start"]["sha256"] == hashlib.sha256(public0).hexdigest()
    ranks = record["execution"]["distributed"]["ranks"]
    assert len(ranks) == 2 and ranks[0]["adapter_sha256"] == ranks[1]["adapter_sha256"]
