"""Pieces of ``training.sharding: fsdp`` (issue 45) that run in one process: the accelerate FSDP config mapping,
FSDP2's dim-0 chunks, the local-shard count of a 1-process FSDP model, and the padding forward's discarded rows."""

from __future__ import annotations

import pytest
import torch

from dplora.engine import distributed
from dplora.engine.sharding import local_chunk
from dplora.errors import BadInputError


def test_an_accelerate_fsdp_config_maps_onto_the_contract_or_is_refused():
    assert distributed.accelerate_fsdp_note("none", {}) is None
    with pytest.raises(BadInputError, match="set training.sharding: fsdp"):
        distributed.accelerate_fsdp_note("none", {"ACCELERATE_USE_FSDP": "true"})
    with pytest.raises(BadInputError, match="CPU offload"):
        distributed.accelerate_fsdp_note("fsdp", {"ACCELERATE_USE_FSDP": "true", "FSDP_OFFLOAD_PARAMS": "true"})
    env = {"ACCELERATE_USE_FSDP": "true", "FSDP_SHARDING_STRATEGY": "FULL_SHARD", "FSDP_VERSION": "2"}
    note = distributed.accelerate_fsdp_note("fsdp", env)
    assert note.startswith("note: accelerate's FSDP config maps onto training.sharding: fsdp")
    assert note.endswith("not applied: FSDP_SHARDING_STRATEGY, FSDP_VERSION")


def test_local_chunks_cover_the_tensor_once_in_order():
    full = torch.arange(7 * 3).view(7, 3)
    for world in (1, 2, 3, 8):
        parts = [local_chunk(full, r, world) for r in range(world)]
        assert torch.equal(torch.cat(parts), full)
        assert sum(p.shape[0] for p in parts) == 7 and all(p.shape[1:] == (3,) for p in parts)
