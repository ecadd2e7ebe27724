"""A unit's contribution stays within C even where C/‖v‖ leaves fp32's normal range (the clip factor would round up
by as much as 2x there), and the contract refuses a C so small that ordinary norms reach that range."""

from __future__ import annotations

import pytest
import torch

from dplora.mechanism.clipping import UnitClipAccumulator


@pytest.mark.parametrize("gamma", [None, 1.0])
@pytest.mark.parametrize(("clip", "row"), [(1e-26, [1e19, 1e19]), (1e-7, [1e32])])
def test_a_subnormal_clip_factor_never_lets_a_unit_exceed_c(clip, row, gamma):
    acc = UnitClipAccumulator(len(row), clip, "cpu", **({} if gamma is None else {"normalize_gamma": gamma}))
    acc.begin_step()
    acc.add(torch.tensor([row]), torch.tensor([0]))
    total, _ = acc.finish()
    assert total.double().norm().item() <= clip * (1 + 1e-5)


def test_an_ordinary_factor_is_unchanged():
    acc = UnitClipAccumulator(2, 1.0, "cpu")
    acc.begin_step()
    acc.add(torch.tensor([[3.0, 4.0]]), torch.tensor([0]))
    total, _ = acc.finish()
    assert total.tolist() == pytest.approx([0.6, 0.8], rel=1e-5)


def test_the_contract_refuses_a_c_below_one_millionth(tmp_path):
    from conftest import contract_dict

    from dplora.contract.loader import parse_contract
    from dplora.errors import BadInputError

    raw = contract_dict(tmp_path / "m", tmp_path / "d.csv", tmp_path / "out", privacy={"max_grad_norm": 1e-7})
    with pytest.raises(BadInputError, match="max_grad_norm"):
        parse_contract(raw)
    raw["privacy"]["max_grad_norm"] = 1e-6
    assert parse_contract(raw).privacy.max_grad_norm == 1e-6
