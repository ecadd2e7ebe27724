"""Attack A7 on the unit key column: synth's verbatim check reads the data as training does, with the unit key
(dplora.synth.files.memorisation_counts)."""

from __future__ import annotations

from support.unit_key_attacks import unit_contract, write_csv


def test_a7_synth_verbatim_check_reads_the_data_as_training_does(tmp_path):
    from dplora.synth.files import memorisation_counts

    path = write_csv(tmp_path / "d.csv", "user_id,message,reply", ["u1,q1,a1", "u2,q2,a2"])
    contract = unit_contract(tmp_path, path)
    rows = [{"message": "q1", "reply": "a1"}, {"message": "zz", "reply": "a2"}, {"message": "x", "reply": "y"}]
    memo = memorisation_counts(rows, contract.data, lambda _m: None, unit_key="user_id")
    assert memo["checked"] is True and memo["flagged_rows"] == [0] and memo["flagged_generated_rows"] == [0, 1]
    # a data file training would refuse (the unit key column gone) is not silently compared as if it were fine
    write_csv(tmp_path / "d.csv", "message,reply", ["q1,a1", "q2,a2"])
    memo = memorisation_counts(rows, contract.data, lambda _m: None, unit_key="user_id")
    assert memo["checked"] is False
