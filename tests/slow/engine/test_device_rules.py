"""The slow tier of tests/engine/test_device_rules.py, whose docstring describes the module."""

from __future__ import annotations

import base64
import importlib.util
import json

import pytest
import torch
from support.device_rules import shared_contract, train

from dplora.recipe import build

NEEDS_BNB = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="the quant extra")


pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


def _execution(result) -> dict:
    envelope = json.loads(result.release_path.read_text())
    return json.loads(base64.b64decode(envelope["payload"]))["predicate"]["execution"]


@pytest.mark.parametrize(
    "model, training",
    [
        pytest.param({"dtype": "fp32"}, {}, id="fp32"),
        pytest.param({"dtype": "bf16"}, {}, id="bf16"),
        pytest.param({"dtype": "bf16"}, {"gradient_checkpointing": True}, id="bf16-checkpointing"),
        pytest.param({"dtype": "bf16", "quantization": "4bit"}, {}, id="bf16-4bit", marks=NEEDS_BNB),
    ],
)
def test_training_path_keeps_to_the_device_rules(model, training, tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """A full run on "cuda:0": load (4-bit: bitsandbytes' NF4 kernels), LoRA, the per-example check, steps,
    device-side noise (the ChaCha20 keystream in torch integer ops), the resume checkpoint and the release."""
    contract = shared_contract(tmp_path, tiny_model_dir, tickets_csv, model=model, training=training)
    precision = torch.get_float32_matmul_precision()
    result, rules, _ = train(contract, signing_key)
    assert result.steps_done == 2 and torch.get_float32_matmul_precision() == precision  # fp32 set TF32 inside
    assert rules.transfers > 0 and rules.checked > 1000  # the run did move to "cuda" and every op was seen
    assert not rules.untagged_mixes  # every tensor beside a CUDA one had a known side: no op was let through blind
    if model.get("quantization") == "4bit":
        assert "bitsandbytes" in rules.seen  # the NF4 kernels ran under the rules
    execution = _execution(result)
    assert execution["device_type"] == "cuda" and execution["base_dtype"] == model["dtype"]
    assert execution["allow_tf32"] is True  # the CUDA default, switched on inside and restored by the rules
    assert "torch integer ops on the cuda device" in execution["noise_generator"]  # the device-side keystream


class OOMAbove:
    """Forward pre-hook on the causal LM: ``torch.OutOfMemoryError`` for batches of more than ``k`` records (the
    probe's 64 and 32), and once more on the first batch of two to ``k`` records after the probe settled on ``k``
    (the loop's halving retry). A step's Poisson batch can hold exactly ``k`` records, so ``k`` itself must count:
    with ``< k`` only, two steps of 0, 1 or 16 records left the retry untried about once in a few hundred runs."""

    def __init__(self, k: int):
        self.k, self.sizes, self.retried, self.probed = k, [], False, False

    def __call__(self, module, args, kwargs):
        size = (kwargs.get("input_ids") if "input_ids" in kwargs else args[0]).shape[0]
        self.sizes.append(size)
        if size > self.k:
            raise torch.OutOfMemoryError(f"simulated: {size} records")
        if not self.probed:  # the probe's first batch that fits ends the probe
            self.probed = size == self.k and 4 * self.k in self.sizes
            return
        if 1 < size <= self.k and not self.retried:
            self.retried = True
            raise torch.OutOfMemoryError(f"simulated once: {size} records")


def test_auto_probe_and_oom_retry_keep_to_the_device_rules(
    tmp_path, tiny_model_dir, tickets_csv, signing_key, monkeypatch
):
    """``physical_batch_size: auto`` probes on "cuda" (no CPU default): 64 and 32 run out of memory, 16 fits; a
    step's batch then runs out once and is retried at half size. Every try and the cleanup after it obey the rules."""
    hook = OOMAbove(16)
    real_setup = build.setup_model

    def setup_with_oom(*args, **kwargs):
        model, tokenizer = real_setup(*args, **kwargs)
        model.base_model.model.register_forward_pre_hook(hook, with_kwargs=True)
        return model, tokenizer

    monkeypatch.setattr(build, "setup_model", setup_with_oom)
    training = {"physical_batch_size": "auto", "expected_batch_size": 8}
    contract = shared_contract(tmp_path, tiny_model_dir, tickets_csv, model={"dtype": "bf16"}, training=training)
    result, rules, _ = train(contract, signing_key)
    assert result.steps_done == 2 and not rules.untagged_mixes
    probe = hook.sizes.index(64)  # after the per-example check's small batches
    assert hook.sizes[probe : probe + 3] == [64, 32, 16] and hook.retried
    assert _execution(result)["physical_batch_size"] == 16
