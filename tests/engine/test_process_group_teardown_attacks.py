"""Attack on the process-group teardown: ``distributed.finish`` leaves only the single-rank group that
``ensure_process_group`` made (``_OWN_GROUP`` holds that group object), never a group the caller made.

FINDING (low; fixed: ``_OWN_GROUP`` now holds the group object and ``finish`` leaves only that one): the flag
outlived the group it named. When the caller leaves that group itself (as
``tests/engine/test_sharding_unit.py::test_lora_stays_outside_fsdp_so_its_unclipped_gradients_are_never_reduced``
does after ``setup_model`` under ``training.sharding: fsdp``), ``_OWN_GROUP`` stayed True; the next run in the same
process, even one under ``sharding: none`` that never touches a group, then destroyed whatever default group exists
by then: the caller's own. ``finish`` is documented as "a no-op without a group, or for a group this process did not
make".
"""

from __future__ import annotations

import torch.distributed as dist
from conftest import train_tiny


def test_a_run_never_leaves_a_group_it_did_not_make_after_its_own_was_left_by_the_caller(
    tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    from dplora.contract.spec import LoraSection, ModelSection, TrainingSection
    from dplora.engine.lora import setup_model

    if dist.is_initialized():
        dist.destroy_process_group()
    try:
        training = TrainingSection(expected_batch_size=4, steps=1, sharding="fsdp")
        model, _ = setup_model(  # dplora makes its single-rank group here
            ModelSection(path=str(tiny_model_dir)), LoraSection(r=4, alpha=8), training, "cpu", "fp32", False, print
        )
        del model
        dist.destroy_process_group()  # the caller leaves it, as test_sharding_unit.py does
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # the caller's own group
        mine = dist.group.WORLD
        result, _ = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key)  # sharding: none
        assert result.exit_code == 0, result.output
        assert dist.is_initialized() and dist.group.WORLD is mine, "the run left a process group it did not make"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
