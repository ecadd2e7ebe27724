"""The slow tier of tests/release/test_released_fields.py, whose docstring describes the module."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import release_statement, train_tiny

VARYING = ("run_id", "started_at", "finished_at")  # per run, not per dataset


def _neighbour(tickets_csv: Path, tmp_path: Path) -> Path:
    """``tickets_csv`` with its last row removed (add/remove neighbours: 120 and 119 rows)."""
    with open(tickets_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    path = tmp_path / "tickets_minus_one.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows[:-1])
    return path


def _comparable(predicate: dict) -> dict:
    """The record without what differs per run or per file by design: ids, timestamps, digests."""
    rec = {k: v for k, v in predicate.items() if k not in VARYING}
    rec["data"] = {**rec["data"], "digest": None, "files": None}  # file names and digests differ by design
    rec["contract"] = {**rec["contract"], "sha256": None}  # the contracts name different data and output paths
    rec["artifacts"] = sorted(a["name"] if isinstance(a, dict) else a for a in rec.get("artifacts", []))
    return rec


def _diff(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _diff(a.get(k), b.get(k), f"{path}.{k}")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_neighbouring_files_give_identical_records(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """Declared public N=119: the 120-row file and its 119-row neighbour both release (the count check is a local
    warning, never a refusal), and every record field but ids, timestamps and digests is identical."""
    smaller = _neighbour(tickets_csv, tmp_path)
    records, outputs = [], []
    for name, data in (("big", tickets_csv), ("small", smaller)):
        result, out = train_tiny(tmp_path, tiny_model_dir, data, signing_key, name=name, privacy={"num_units": 119})
        assert result.exit_code == 0, result.output
        records.append(_comparable(release_statement(out)["predicate"]))
        outputs.append(result.output)
    # the count check is a private diagnostic: never in the output (not a terminal), only in <out>.private/train.log
    assert all("more protected units" not in o for o in outputs)
    logs = [(tmp_path / f"{n}.private" / "train.log").read_text() for n in ("big", "small")]
    assert "more protected units than privacy.num_units=119" in logs[0]
    assert "more protected units" not in logs[1]
    assert _diff(*records) == []
    acc = records[0]["accounting"]
    assert (acc["num_units"], acc["num_units_source"]) == (119, "contract")
    assert acc["sample_rate"] == pytest.approx(8 / 119)
    assert "120" not in json.dumps(records[0]["accounting"])
    # issue 46: the attack ceiling is a function of the public q, σ, T and adjacency only; verify recomputes it
    ceilings = [r["attack_ceiling"] for r in records]
    assert ceilings[0] == ceilings[1] and ceilings[0]["available"] is True
    assert 0.01 < ceilings[0]["true_positive_rate_at"]["1%"] <= 1.0
    from dplora.release.verify import verify_release

    for name in ("big", "small"):
        result = verify_release(tmp_path / name, signing_key[1])
        assert result.ceiling_recorded and result.attack_ceiling == ceilings[0]


def test_replace_one_with_held_out_split_needs_declared_n(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """Replace-one: the counted N is public (recorded with why), unless eval_fraction can move the unit out."""
    privacy = {"num_units": None, "adjacency": "replace_one", "accountant": "pld"}
    split, _ = train_tiny(
        tmp_path, tiny_model_dir, tickets_csv, signing_key, name="split", privacy=privacy, data={"eval_fraction": 0.2}
    )
    assert split.exit_code == 2 and "data.eval_fraction can move the replaced unit" in split.output
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, name="plain", privacy=privacy)
    assert result.exit_code == 0, result.output
    acc = release_statement(out)["predicate"]["accounting"]
    assert (acc["num_units"], acc["num_units_source"]) == (120, "data")
    assert "public under replace-one" in acc["num_units_note"]


PRIVATE_KEYS = ("train_loss", "units", "records", "seconds", "not_covered_by_dp")


def test_release_folder_holds_only_covered_files(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """The release folder: adapters, card, contract, signed files, nothing else and no per-step private number;
    ``<output_dir>.private/`` holds them, with a notice not to ship it."""
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key)
    assert result.exit_code == 0, result.output
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    signed = {s["name"] for s in release_statement(out)["subject"]}
    assert set(files) == signed | {"release.dsse.json", "release.sigstore.json"}
    assert all(f.startswith("adapter/") or f == "contract.yaml" for f in signed), files
    for path in out.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".yaml", ".md"):
            text = path.read_text()
            assert not any(f'"{k}"' in text for k in PRIVATE_KEYS), path
    private = out.with_name(out.name + ".private")
    assert sorted(p.name for p in private.iterdir()) == ["DO_NOT_SHIP.txt", "metrics.jsonl", "report.json", "train.log"]
    report = json.loads((private / "report.json").read_text())
    assert report["empty_steps"] >= 0 and report["seconds"] >= 0
    assert "never ship" in (private / "DO_NOT_SHIP.txt").read_text()
    steps = [json.loads(x) for x in (private / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in steps if "step" in x]
    assert [x["step"] for x in steps] == [1, 2, 3]
    assert all(x["seconds"] >= 0 and x["not_covered_by_dp"]["units"] >= 0 for x in steps)
    assert all("train_loss" in x["not_covered_by_dp"] for x in steps)
