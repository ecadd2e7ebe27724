"""Attack A5 on the unit key column: resume refuses a changed unit key, or data changed only in its unit key column
(dplora.run.resume)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from support.unit_key_attacks import SEED, unit_contract, write_csv

from dplora.data import units as data_mod
from dplora.errors import BadInputError


def _load(contract, light=False):
    return data_mod.load_table(contract.data, unit_key=contract.privacy.unit_key, light=light)


def _info(contract, index, digest, plan):
    meta = {
        "contract_yaml": contract.to_yaml(),
        "data": {"sha256": digest, "num_records": index.num_records, "num_units": index.num_units},
        "plan": plan.to_dict(),
        "accountant_history": [],
    }
    return SimpleNamespace(meta=meta, step=1, path=Path("ckpt"))


def test_a5_resume_refuses_a_changed_unit_key_or_data_changed_only_in_its_unit_key(tmp_path):
    from dplora.data.digest import sha256_file
    from dplora.run.resume import check_resumable, resume_point

    rows = [f"u{i % 5},v{i % 4},q{i},a{i}" for i in range(20)]
    path = write_csv(tmp_path / "d.csv", "user_id,other,message,reply", rows)
    saved = {"steps": 5, "sample_rate": 0.1, "noise_multiplier": 1.0, "accountant": "prv", "delta": 1e-5,
             "max_grad_norm": 1.0, "num_units": 5}  # fmt: skip
    plan = SimpleNamespace(to_dict=lambda: saved, noise_multiplier=1.0, sample_rate=0.1, steps=5)
    contract = unit_contract(tmp_path, path)
    index = data_mod.build_unit_index(_load(contract), contract.privacy, seed=SEED)
    info = _info(contract, index, sha256_file(Path(path)), plan)
    check_resumable(info, contract.to_yaml(), path, plan, index, sha256_file(Path(path)))  # same: accepted

    rekeyed = unit_contract(tmp_path, path, key="other")  # another unit key column: the contract check refuses first
    with pytest.raises(BadInputError, match=r"contract changed.*privacy\.unit_key"):
        check_resumable(info, rekeyed.to_yaml(), path, plan, index, sha256_file(Path(path)))

    # the same rows and unit count, only the unit key values swapped between two users: a different file
    swapped = [r.replace("u1,", "uX,").replace("u2,", "u1,").replace("uX,", "u2,") for r in rows]
    write_csv(tmp_path / "d.csv", "user_id,other,message,reply", swapped)
    now = data_mod.build_unit_index(_load(contract), contract.privacy, seed=SEED)
    assert (now.num_records, now.num_units) == (index.num_records, index.num_units)
    with pytest.raises(BadInputError, match="the data changed") as err:
        check_resumable(info, contract.to_yaml(), path, plan, now, sha256_file(Path(path)))
    assert "20" not in str(err.value).replace(str(tmp_path), "")  # no counts: they are private
    # resume_point hashes the data section's own file (not a cached or eval file)
    staging = tmp_path / "out.partial"
    assert not staging.exists()
    with pytest.raises(BadInputError):
        resume_point(staging, contract.to_yaml(), contract.data, plan, now)
