"""Helpers shared by tests/accounting/test_event_form.py and its slow tier under tests/slow/."""

from __future__ import annotations

from dplora.accounting.events import Adjacency, DpSgdEvent

EVENT = DpSgdEvent(sample_rate=0.0625, noise_multiplier=0.93, steps=37, adjacency=Adjacency.REPLACE_ONE)
