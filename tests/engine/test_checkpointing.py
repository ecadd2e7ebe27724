"""Gradient checkpointing on the fast per-example path (issue 27.1), against the one-record-at-a-time reference.

transformers' non-reentrant activation checkpointing re-runs each decoder layer's forward inside the backward.
Each LoRA layer's per-example gradient must still be written exactly once, from the dropout masks the loss used.
The reference replays, one record at a time through peft's stock forward, the masks drawn by the ORIGINAL forward
(captured outside the backward): if the recomputation drew new masks, the fast rows would differ from it.
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from support.architectures import RECORDS
from support.checkpointing import PAD, shared_model
from tiny import tiny_causal_lm

from dplora.engine import batch as batching
from dplora.engine.fastclip import FlatLoRAGrads, checkpointing_mode
from dplora.errors import TrainingFailedError
from dplora.mechanism import optimizer as dpopt

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


def test_reentrant_checkpointing_and_a_second_write_are_refused():
    base, _ = tiny_causal_lm("llama")
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"]))
    assert checkpointing_mode(model) == "reentrant"
    with pytest.raises(TrainingFailedError, match="reentrant"):
        FlatLoRAGrads(model)
    model = shared_model(checkpointing=True, dropout=0.0, targets=["q_proj"])
    flat = FlatLoRAGrads(model)
    flat.buffer(2)
    losses = batching.per_sequence_loss(model, batching.collate(RECORDS[:2], PAD))
    losses.sum().backward(retain_graph=True)
    losses.sum().backward()  # a second backward of the same forward: two writes for one forward
    with pytest.raises(TrainingFailedError, match="2 per-example gradient writes for 1 forwards"):
        flat.gradients()


def test_opacus_path_refuses_checkpointing():
    model = shared_model(checkpointing=True, dropout=0.0, targets=["q_proj"])
    params = [p for p in model.parameters() if p.requires_grad]
    plan = type(
        "Plan", (), {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "expected_batch_size": 2, "sample_rate": 0.1}
    )
    with pytest.raises(TrainingFailedError, match="re-fires Opacus hooks"):
        dpopt.make_private(model, torch.optim.SGD(params, lr=0.1), plan=plan, unit_mean=False, per_sample="opacus")
    dpopt.make_private(model, torch.optim.SGD(params, lr=0.1), plan=plan, unit_mean=False, per_sample="fast")
