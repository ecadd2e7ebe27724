"""The slow tier of tests/engine/test_checkpointing.py, whose docstring describes the module."""

from __future__ import annotations

import copy

import pytest
import torch
from support.architectures import RECORDS, brute_force, clipped_unit_sum, fast_logical_step, rel
from support.checkpointing import PAD, shared_model
from support.lora import ReplayDropout

from dplora.engine import batch as batching
from dplora.engine.fastclip import FlatLoRAGrads, checkpointing_mode

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


def _capture_original_masks(model):
    """Hooks on every LoRA dropout: per physical batch, the mask of the forward that ran OUTSIDE the backward
    (the one the loss used), and a count of all dropout calls (recomputations included)."""
    masks, calls = {}, {"original": 0, "all": 0}

    def hook_for(name):
        def hook(module, inputs, output):
            calls["all"] += 1
            if torch._C._current_graph_task_id() == -1:  # not a recomputation inside the backward
                calls["original"] += 1
                masks.setdefault(name, []).append((output != 0).float() / (1 - module.p))

        return hook

    for name, m in model.named_modules():
        if hasattr(m, "lora_dropout") and isinstance(m.lora_dropout["default"], torch.nn.Dropout):
            m.lora_dropout["default"].register_forward_hook(hook_for(name))
    return masks, calls


def _reference_with_masks(reference_model, masks, order, physical):
    """One-record rows (in ``order``) with each record's own columns of its physical batch's original masks."""
    per_record = {}
    for b, start in enumerate(range(0, len(order), physical)):
        chunk = order[start : start + physical]
        width = max(len(RECORDS[r][0]) for r in chunk)
        replays = {}
        for name, m in reference_model.named_modules():
            if name in masks:
                mask = masks[name][b]
                replays[name] = ReplayDropout(torch.nn.functional.pad(mask, (0, 0, 0, max(0, width - mask.shape[1]))))
                m.lora_dropout["default"] = replays[name]
        for i, r in enumerate(chunk):
            for replay in replays.values():
                replay.example = i
            per_record[r] = brute_force(reference_model, [RECORDS[r]])[0]
    return torch.stack([per_record[r] for r in order])


@pytest.mark.parametrize(
    "groups, physical",
    [
        ([[i] for i in range(len(RECORDS))], 6),  # row level, one physical batch
        ([[i] for i in range(len(RECORDS))], 4),  # row level, a logical batch over two physical batches
        ([[0, 1], [2, 3, 4], [5]], 2),  # unit level, unit 1 spans two physical batches
    ],
)
def test_checkpointing_matches_reference_with_the_losss_dropout_masks(groups, physical):
    """Checkpointed fast rows and per-unit clipped sum equal the one-record reference with the same masks."""
    model = shared_model(checkpointing=True)
    assert checkpointing_mode(model) == "non-reentrant"
    reference_model = copy.deepcopy(model)
    for m in reference_model.modules():  # the reference: stock peft forward, no checkpointing
        if hasattr(m, "gradient_checkpointing"):
            m.gradient_checkpointing = False
    masks, calls = _capture_original_masks(model)
    flat = FlatLoRAGrads(model)
    order = [r for g in groups for r in g]
    probe = torch.stack([brute_force(copy.deepcopy(reference_model), [RECORDS[r]])[0] for r in order])
    c = float(torch.stack([probe[[order.index(r) for r in g]].sum(0) for g in groups]).norm(dim=1).median())
    rows, total = fast_logical_step(model, flat, RECORDS, groups, physical, c)
    assert calls["all"] == 2 * calls["original"] > 0  # every layer's forward was recomputed in the backward
    reference = _reference_with_masks(reference_model, masks, order, physical)
    assert float(reference.abs().max()) > 0.05
    assert rel(rows, reference) < 1e-5
    ref_index = {r: i for i, r in enumerate(order)}
    ref_groups = [[ref_index[r] for r in g] for g in groups]
    assert rel(total, clipped_unit_sum(reference, ref_groups, c)) < 1e-5
    # the masks matter: without dropout the reference differs
    assert rel(probe, reference) > 1e-2


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_checkpointing_equals_no_checkpointing_under_the_same_seed(arch):
    """Same weights, same RNG seed, dropout 0.3: G with checkpointing equals G without, bit for bit or 1e-6."""
    rows = {}
    for checkpointing in (False, True):
        model = shared_model(checkpointing=checkpointing, arch=arch, targets=None)
        flat = FlatLoRAGrads(model)
        torch.manual_seed(1234)
        G = flat.buffer(len(RECORDS))
        batching.per_sequence_loss(model, batching.collate(RECORDS, PAD)).sum().backward()
        assert flat.gradients() is G
        assert all(s.writes == s.forwards == 1 for s in flat._slots)  # written exactly once per backward
        rows[checkpointing] = G.clone()
    assert float(rows[False].abs().max()) > 0.05
    assert rel(rows[True], rows[False]) < 1e-6
