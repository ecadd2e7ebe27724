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


def test_lora_stays_outside_fsdp_so_its_unclipped_gradients_are_never_reduced(tiny_model_dir):
    """Issue 49 ("FSDP's own gradient all-reduce must be off for LoRA weights"): under ``training.sharding: fsdp``
    every base parameter is an FSDP2 DTensor shard, and every LoRA tensor is a plain, whole tensor that no FSDP group
    manages, so FSDP's reduce-scatter never sees its (unclipped) gradient; after a backward the LoRA gradients are
    plain local tensors while the frozen base has none."""
    from torch.distributed.tensor import DTensor

    from dplora.contract.spec import LoraSection, ModelSection, TrainingSection
    from dplora.engine.lora import setup_model

    training = TrainingSection(expected_batch_size=4, steps=1, sharding="fsdp")
    started = torch.distributed.is_initialized()
    try:
        model, _ = setup_model(
            ModelSection(path=str(tiny_model_dir)), LoraSection(r=4, alpha=8), training, "cpu", "fp32", False, print
        )
        lora = {n: p for n, p in model.named_parameters() if "lora_" in n}
        base = {n: p for n, p in model.named_parameters() if "lora_" not in n}
        assert lora and base
        assert not any(isinstance(p, DTensor) for p in lora.values())
        assert all(isinstance(p, DTensor) and not p.requires_grad for p in base.values())
        managed = set()
        for module in model.modules():  # FSDP2's per-module state: the parameters each group shards and reduces
            state = getattr(module, "_get_fsdp_state", None)
            group = state()._fsdp_param_group if state is not None else None
            managed |= {id(fp.sharded_param) for fp in group.fsdp_params} if group is not None else set()
        assert managed and not managed & {id(p) for p in lora.values()}
        ids = torch.tensor([[1, 2, 3, 4]])
        model(input_ids=ids, labels=ids).loss.backward()
        assert all(p.grad is not None and not isinstance(p.grad, DTensor) for p in lora.values() if p.requires_grad)
        assert all(p.grad is None for p in base.values())
    finally:
        if not started and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@pytest.mark.parametrize("outcome", ["released", "failed"])
def test_an_fsdp_run_frees_its_model_before_it_leaves_the_group_it_made(
    tmp_path, tiny_model_dir, tickets_csv, signing_key, monkeypatch, outcome
):
    """A peft-wrapped FSDP2 model is cyclic garbage once ``run_training`` returns (or kept by a failure's
    traceback), and its sharded tensors hold the process group. Collected after the group is gone (at interpreter
    exit), gloo aborts the process (``terminate called without an active exception``, SIGABRT: a failed
    ``torchrun`` rank after a good run, seen in CI). So the run drops the failure's frames, collects the model, then
    leaves the group; a single-rank group the run made is left too."""
    import gc

    import torch.distributed as dist
    from conftest import train_tiny
    from torch.distributed.fsdp import FSDPModule

    if dist.is_initialized():
        dist.destroy_process_group()
    alive_at_destroy = []
    real = dist.destroy_process_group

    def spy(*args, **kwargs):
        alive_at_destroy.append(sum(isinstance(o, FSDPModule) for o in gc.get_objects()))
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", spy)
    from dplora.errors import TrainingFailedError
    from dplora.run import checkpoint

    def fail(point, _step):
        if outcome == "failed" and point == "loop-end":  # after the last step, with the model in the failing frames
            raise TrainingFailedError("planted failure after the steps")

    with checkpoint.fault_hook(fail):
        result, _ = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, training={"sharding": "fsdp"})
    assert result.exit_code == (0 if outcome == "released" else 4), result.output
    assert alive_at_destroy == [0]  # left once, with no sharded module alive (the tiny model has 3 FSDP modules)
    assert not dist.is_initialized()
