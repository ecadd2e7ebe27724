"""One serialised form of the DP-SGD event (issue 44, item 3): the record's ``mechanism``, a ledger charge's events
and composition all write :meth:`DpSgdEvent.to_dict` and read it back with :meth:`DpSgdEvent.from_dict`."""

from __future__ import annotations

import pytest
from support.event_form import EVENT

from dplora.accounting.events import DpSgdEvent


def test_from_dict_reads_back_what_to_dict_wrote():
    assert DpSgdEvent.from_dict(EVENT.to_dict()) == EVENT
    # the adjacency a ledger charge states once replaces the entry's own
    entry = {k: v for k, v in EVENT.to_dict().items() if k != "adjacency"}
    assert DpSgdEvent.from_dict(entry, adjacency="replace_one") == EVENT
    assert DpSgdEvent.from_dict({**EVENT.to_dict(), "noise_multiplier": 1}).noise_multiplier == 1.0


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"noise_multiplier": True}, ValueError),  # a bool is not a σ
        ({"noise_multiplier": "0.9"}, ValueError),
        ({"sample_rate": 0.0}, ValueError),
        ({"steps": 3.0}, ValueError),
        ({"sampler": "shuffle"}, ValueError),  # only Poisson sampling is accounted
        ({"adjacency": "neighbour"}, ValueError),
    ],
)
def test_from_dict_refuses_a_malformed_entry(change, error):
    with pytest.raises(error):
        DpSgdEvent.from_dict({**EVENT.to_dict(), **change})


def test_a_missing_key_or_a_non_dict_is_refused():
    with pytest.raises(KeyError):
        DpSgdEvent.from_dict({"sample_rate": 0.1, "steps": 3, "adjacency": "add_remove"})
    with pytest.raises(TypeError):
        DpSgdEvent.from_dict([0.1, 1.0, 3])
