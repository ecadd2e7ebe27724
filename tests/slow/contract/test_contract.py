"""The slow tier of tests/contract/test_contract.py, whose docstring describes the module."""

from __future__ import annotations

from support.contract import shared_raw

from dplora.contract.loader import parse_contract


def test_performance_flags_do_not_change_the_plan():
    """physical_batch_size and threads are performance flags: the plan and its DpSgdEvent stay identical."""
    from dplora.plan.training import make_plan

    raw = shared_raw()
    raw["privacy"]["num_units"] = 1000
    base = make_plan(parse_contract(raw), num_units=1000, num_units_source="contract")
    raw["training"]["physical_batch_size"] = 1
    raw["training"]["threads"] = 2
    other = make_plan(parse_contract(raw), num_units=1000, num_units_source="contract")
    assert base.to_dict() == other.to_dict()
    assert base.event == other.event
