"""Device placement and precision (issue 10): the CUDA fault class caught on CPU, bf16 base weights, the record.

CI has no GPU. The fault seen on an H200 (a synthetic probe batch built on the CPU while the model was on
``cuda:0``) belongs to a class that a CPU run can still catch: any tensor that dplora's own code creates
without naming a device lands on the CPU. :class:`DevicePolice` fails every such call during a full run.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from support.device import PACKAGE, DevicePolice, shared_contract
from support.lora import randomize_lora_b
from tiny import tiny_llama

from dplora.contract.loader import parse_contract
from dplora.engine import batch as batching
from dplora.engine import gradcheck
from dplora.engine.model import resolve_precision
from dplora.errors import TrainingFailedError
from dplora.mechanism import optimizer as dpopt
from dplora.recipe.config import RunOptions
from dplora.recipe.train import run_training
from dplora.release import envelope as release

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


def test_device_police_catches_a_cpu_default():
    """The check itself can fail: a factory call from dplora code without a device is recorded."""
    police = DevicePolice(torch.device("cpu"))
    with police:
        batching.collate([([1, 2], [1, 2])], pad_id=0, device="cpu")  # names its device: fine
    assert police.violations == []
    code = compile("torch.zeros(3)", str(Path(PACKAGE) / "fake.py"), "exec")
    with police:
        exec(code, {"torch": torch})  # noqa: S102 - a call that appears to come from inside dplora
    assert police.violations == ["no device: fake.py:1 zeros"]


def test_failure_before_the_loop_is_one_line_and_leaves_failed_json(
    tmp_path, tiny_model_dir, tickets_csv, signing_key, monkeypatch
):
    """An engine fault in setup (here: the probe raising a device error) exits 4 naming the stage, never
    'unexpected'; FAILED.json records 0 steps and ε = 0; no release."""

    def broken_probe(gsm, named, dp_opt=None, *, log=None):
        raise RuntimeError("Expected all tensors to be on the same device, but found cuda:0 and cpu!\nsecond line")

    monkeypatch.setattr(gradcheck, "probe_per_sample_gradients", broken_probe)
    contract = shared_contract(tmp_path, tiny_model_dir, tickets_csv)
    with pytest.raises(TrainingFailedError) as info:
        run_training(
            contract, RunOptions(signing_key=signing_key[0], data_key=None, progress=False, threads=1), log=lambda *_: 0
        )
    message = str(info.value)
    assert info.value.exit_code == 4 and "\n" not in message
    assert message.startswith("setting up per-sample gradients failed on cpu: RuntimeError: Expected all tensors")
    failed = json.loads((tmp_path / "run.partial" / "FAILED.json").read_text())
    assert failed["steps_done"] == 0 and failed["epsilon_charged_upper_bound"] == 0.0
    assert not list(tmp_path.rglob(release.RELEASE_FILENAME))


def test_precision_resolution():
    """auto → fp32 on CPU; bf16 when asked; TF32 only means something on CUDA."""

    def contract(**m):
        raw = {
            "privacy": {
                "protected_unit": "row",
                "adjacency": "add_remove",
                "target_epsilon": 1.0,
                "delta": 1e-5,
                "max_grad_norm": 1.0,
            },
            "model": {"name": "smollm2-135m", **m},
            "data": {"path": "x.csv", "text_column": "t"},
            "training": {"expected_batch_size": 1, "steps": 1},
        }
        return parse_contract(raw).model

    cpu = torch.device("cpu")
    assert resolve_precision(contract(), cpu) == ("fp32", False)
    assert resolve_precision(contract(dtype="bf16"), cpu) == ("bf16", False)
    assert resolve_precision(contract(dtype="fp32", allow_tf32=True), cpu) == ("fp32", False)
    with pytest.raises(Exception, match="model.dtype"):
        contract(dtype="fp16")


def _bf16_lora_model():
    model = tiny_llama(hidden=32, seed=3).to(torch.bfloat16)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    peft_model = get_peft_model(model, config, autocast_adapter_dtype=True)
    return randomize_lora_b(peft_model, 7)


def test_bf16_base_per_example_norms_match_one_at_a_time():
    """bf16 base, fp32 LoRA: batched per-example gradient norms (Opacus path) within 1e-2 relative of the same
    bf16 model run one example at a time (its own autograd gradient, unpadded)."""
    records = [
        ([1, 2, 3, 4, 5, 6], [-100, -100, 3, 4, 5, 6]),
        ([7, 8, 9], [7, 8, 9]),
        ([10, 11, 12, 13, 14, 15, 16, 17, 18], [10, 11, 12, 13, 14, 15, 16, 17, 18]),
        ([20, 21, 22, 23], [-100, 21, 22, 23]),
    ]
    model = _bf16_lora_model()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert named and all(p.dtype == torch.float32 for _, p in named)
    assert model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight.dtype == torch.bfloat16
    reference = copy.deepcopy(model)
    expected = []
    for example in records:
        reference.zero_grad(set_to_none=True)
        batching.per_sequence_loss(reference, batching.collate([example], 256)).sum().backward()
        ref_named = [p for n, p in reference.named_parameters() if p.requires_grad]
        expected.append(float(torch.cat([p.grad.reshape(-1) for p in ref_named]).norm()))
    optimizer = torch.optim.SGD([p for _, p in named], lr=0.0)
    plan = type("P", (), {"noise_multiplier": 0.0, "max_grad_norm": 1.0, "expected_batch_size": 4, "sample_rate": 0.5})
    gsm, _, _ = dpopt.make_private(model, optimizer, plan=plan, unit_mean=False)
    batching.per_sequence_loss(gsm, batching.collate(records, 256)).sum().backward()
    got = torch.cat([p.grad_sample.reshape(len(records), -1) for _, p in named], dim=1).norm(dim=1)
    assert min(expected) > 1e-3
    for g, e in zip(got.tolist(), expected, strict=True):
        assert abs(g - e) / e < 1e-2
