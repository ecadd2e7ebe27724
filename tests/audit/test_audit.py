"""dplora audit: canaries as protected units, exposure and AUC by hand, the CLI on a tiny model, refusals."""

from __future__ import annotations

import pytest
from conftest import contract_dict, write_contract

from dplora.audit import canaries, scores
from dplora.contract.loader import load_contract

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


def test_exposure_and_auc_by_hand():
    # canary loss 1.0 among candidates [0.5, 2, 3]: rank 2 of 4 → log2(4) − log2(2) = 1 bit.
    assert scores.exposure(1.0, [0.5, 2.0, 3.0]) == pytest.approx(1.0)
    assert scores.exposure(0.1, [0.5, 2.0, 3.0]) == pytest.approx(2.0)  # rank 1: the maximum, log2(4)
    assert scores.exposure(5.0, [0.5, 2.0, 3.0]) == pytest.approx(0.0)
    # members [3, 1], non-members [2, 1]: pairs (3>2, 3>1, 1<2, 1=1) → (1 + 1 + 0 + 0.5) / 4.
    assert scores.auc([3.0, 1.0], [2.0, 1.0]) == pytest.approx(0.625)
    with pytest.raises(ValueError):
        scores.auc([], [1.0])


def test_canary_rows_one_unit_each(tmp_path, tiny_model_dir, tickets_csv):
    cfg = write_contract(
        tmp_path / "t.yaml",
        contract_dict(
            tiny_model_dir, tickets_csv, tmp_path / "o", privacy={"protected_unit": "ticket", "unit_key": "ticket_id"}
        ),
    )
    contract = load_contract(cfg)
    rows = canaries.canary_rows(
        contract.data, contract.privacy.unit_key, "dplora-canary-00001", "AAAA-BBBB-CCCC-DDDD", copies=4
    )
    assert len(rows) == 4 and {r["ticket_id"] for r in rows} == {"dplora-canary-00001"}
    assert all("AAAA-BBBB-CCCC-DDDD" in r["reply"] and r["message"] == canaries.PROMPT for r in rows)
    row_level = load_contract(write_contract(tmp_path / "r.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp_path)))
    with pytest.raises(ValueError, match="copies=2"):
        canaries.canary_rows(row_level.data, row_level.privacy.unit_key, "u", "s", copies=2)
    drawn = canaries.make_canaries(400)
    assert len({c.secret for c in drawn}) == 400 and len({c.unit_id for c in drawn}) == 400
    assert 140 < sum(c.inserted for c in drawn) < 260  # Binomial(400, 1/2): mean 200, sd 10
