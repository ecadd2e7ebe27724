"""Ranks agree on their inputs before step 1 (issue 22, item 4).

Each rank of a torchrun/accelerate run loads and indexes its own copy of ``data.path`` and owns the units
u mod W of its own order. A rank that reads the same rows in another order shares units with the other rank and
leaves others unsampled (sensitivity 2C); on main such a run trained and released. Now every rank all-gathers the
data digest, the unit count, the unit-index digest and the contract and plan digests before step 1, and stops.
"""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

from conftest import contract_dict
from support.torchrun import train_on_two_ranks

from dplora.contract.loader import parse_contract
from dplora.data import units as data_mod
from dplora.engine import distributed


def _reordered_copy(source: Path, target: Path) -> Path:
    """The same rows (same header) in reverse order."""
    with source.open(newline="") as fh:
        rows = list(csv.reader(fh))
    with target.open("w", newline="") as fh:
        csv.writer(fh).writerows([rows[0], *reversed(rows[1:])])
    return target


def _digests(raw: dict, path: Path) -> dict:
    """Every rank's digests with the same contract, the rows read from ``path`` (this rank's copy)."""
    contract = parse_contract(raw)
    table = data_mod.load_table(parse_contract({**raw, "data": {**raw["data"], "path": str(path)}}).data)
    index = data_mod.build_unit_index(table, contract.privacy, seed=0)
    plan = SimpleNamespace(to_dict=lambda: {"sigma": 1.0})
    columns = data_mod.required_columns(contract.data, contract.privacy.unit_key)
    return distributed.input_digests(plan, table, index, columns=columns, contract_sha256=contract.sha256)


def test_digests_tell_a_reordered_copy_apart(tmp_path, tiny_model_dir, tickets_csv):
    """Row level: same rows, another order → only the data digest differs; user level: the unit index too."""
    flipped = _reordered_copy(tickets_csv, tmp_path / "flipped.csv")
    raw = contract_dict(tiny_model_dir, tickets_csv, tmp_path / "out")
    a, b, again = _digests(raw, tickets_csv), _digests(raw, flipped), _digests(raw, tickets_csv)
    assert a == again and a["num_units"] == b["num_units"] == 120
    assert distributed.disagreement([a, again]) is None
    message = distributed.disagreement([a, b])
    assert message.startswith("the ranks disagree before step 1: rank 1's data digest (the training rows' text")
    assert "unit index" not in message and "contract digest" not in message and "\n" not in message
    user = dict(raw, privacy={**raw["privacy"], "protected_unit": "user", "unit_key": "customer_id"})
    ua, ub = _digests(user, tickets_csv), _digests(user, flipped)
    assert ua["unit_index_sha256"] != ub["unit_index_sha256"] and ua["num_units"] == ub["num_units"]
    fewer = dict(ub, num_units=ub["num_units"] - 1)
    assert f"({ub['num_units'] - 1} units on rank 1, {ua['num_units']} on rank 0)" in distributed.disagreement(
        [ua, fewer]
    )


def test_two_ranks_reading_a_reordered_copy_stop_before_step_1(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """2 gloo processes; rank 1's data.path holds the same rows in reverse order. Both ranks exit 2, rank 0 with one
    line naming the data digest (the other process of the node stays quiet); no release, no output folder."""
    dirs = [tmp_path / "rank0", tmp_path / "rank1"]
    for d in dirs:
        d.mkdir()
    (dirs[0] / "tickets.csv").write_bytes(tickets_csv.read_bytes())
    _reordered_copy(tickets_csv, dirs[1] / "tickets.csv")
    out = tmp_path / "run"
    raw = contract_dict(tiny_model_dir, Path("tickets.csv"), out, training={"steps": 2}, privacy={"num_units": 120})
    proc, codes = train_on_two_ranks(tmp_path, raw, dirs, signing_key)
    released = (out / "release.dsse.json").exists()
    assert codes == [2, 2], (codes, released, proc.stderr[-1500:])
    assert not released and not out.exists() and not out.with_name("run.partial").exists()
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-1500:]
    assert "rank 1's data digest (the training rows' text, in order) differ from rank 0's" in lines[0]
    assert "Traceback" not in proc.stderr


def test_two_ranks_with_other_model_weights_stop_before_step_1(tmp_path, tickets_csv, signing_key):
    """Red-team case: the same data and contract, but rank r's relative ``model.path`` holds a tiny Llama with
    other random weights. On the first fix both ranks exited 0 with a release (the adapters agree: every rank applies
    the same noisy mean), though a unit's clipped gradient depended on which rank owned it. Now the base-model
    digest is all-gathered after loading: both ranks exit 2, nothing written."""
    from tiny import save_tiny_model

    dirs = [tmp_path / "rank0", tmp_path / "rank1"]
    for r, d in enumerate(dirs):
        d.mkdir()
        (d / "tickets.csv").write_bytes(tickets_csv.read_bytes())
        save_tiny_model(d / "model", seed=100 + r)
    out = tmp_path / "run"
    raw = contract_dict(Path("model"), Path("tickets.csv"), out, training={"steps": 2}, privacy={"num_units": 120})
    proc, codes = train_on_two_ranks(tmp_path, raw, dirs, signing_key)
    assert codes == [2, 2], (codes, proc.stderr[-1500:])
    assert not out.exists() and not out.with_name("run.partial").exists()
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "rank 1's base model digest" in lines[0], proc.stderr[-1500:]
    assert "Traceback" not in proc.stderr
