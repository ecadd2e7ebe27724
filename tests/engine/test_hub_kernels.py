"""No code from the Hub at run time: transformers' Hub kernels stay off in every model load and in ``train()``.

transformers 5.x turns Hub kernels on by default when the ``kernels`` package is installed: ``from_pretrained``
kernelizes the model, and ``model.train()`` kernelizes it again for training, which on CUDA fetches
``kernels-community/*`` layers from the Hub (offline: the run dies before step 1). CI has no GPU, so the tests
replace every kernelize entry point by one that records the call and raises: on CUDA that call is the fetch.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import contract_dict

from dplora.contract.loader import parse_contract
from dplora.engine import model as model_mod

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


def _trap_kernelize(monkeypatch) -> list[str]:
    """Every way transformers kernelizes a model records its caller and raises (the Hub fetch on CUDA)."""
    from transformers import modeling_utils
    from transformers.integrations import hub_kernels

    calls: list[str] = []

    def trapped(where):
        def kernelize(model, *args, **kwargs):
            calls.append(where)
            raise RuntimeError(f"{where}: Kernel repository 'kernels-community/rotary' could not be fetched")

        return kernelize

    monkeypatch.setattr(modeling_utils, "is_kernels_available", lambda: True)  # as where `kernels` is installed
    monkeypatch.setattr(modeling_utils, "kernelize", trapped("modeling_utils.kernelize"))
    monkeypatch.setattr(hub_kernels, "kernelize", trapped("hub_kernels.kernelize"))
    monkeypatch.setattr(hub_kernels, "_kernels_kernelize", trapped("kernels.kernelize"), raising=False)
    return calls


def test_no_hub_kernels_is_the_load_argument_of_the_installed_transformers():
    """The installed transformers (5.x) takes ``use_kernels``: every load passes False."""
    import transformers

    assert int(transformers.__version__.split(".")[0]) >= 5
    assert model_mod.no_hub_kernels() == {"use_kernels": False}


def test_setup_model_never_kernelizes(tmp_path, tiny_model_dir, tickets_csv, monkeypatch):
    """The run's model set-up (load, LoRA, ``peft_model.train()``) with Hub kernels "available" and the user's
    environment at transformers' default (``USE_HUB_KERNELS`` unset = YES): no kernelize call, the variable is
    NO afterwards and the base model's ``use_kernels`` is False. On main the load itself kernelized (the trap
    raised in ``from_pretrained``)."""
    from dplora.engine.lora import setup_model

    monkeypatch.delenv(model_mod.HUB_KERNELS_ENV, raising=False)
    calls = _trap_kernelize(monkeypatch)
    contract = parse_contract(contract_dict(tiny_model_dir, tickets_csv, tmp_path / "run"))
    peft_model, _ = setup_model(
        contract.model, contract.lora, contract.training, torch.device("cpu"), "fp32", False, log=lambda *_: None
    )
    assert calls == []
    assert os.environ[model_mod.HUB_KERNELS_ENV] == "NO"
    base = peft_model.get_base_model()
    assert base.use_kernels is False and base.training is True
    peft_model.train()  # a second train() (as the loop's train/eval switches) does not kernelize either
    peft_model.eval()
    assert calls == []


def test_a_hub_kernel_request_is_refused_once_dplora_configured_transformers(tmp_path, tiny_model_dir, monkeypatch):
    """Even a model that asks for kernels after dplora's configuration cannot fetch any: with
    ``USE_HUB_KERNELS=NO`` transformers' own kernelize raises before it reaches the Hub."""
    from transformers import AutoModelForCausalLM
    from transformers.integrations import hub_kernels

    monkeypatch.delenv(model_mod.HUB_KERNELS_ENV, raising=False)
    model_mod.quiet_transformers()
    assert os.environ[model_mod.HUB_KERNELS_ENV] == "NO"
    fetched: list[str] = []
    monkeypatch.setattr(hub_kernels, "_kernels_kernelize", lambda *a, **k: fetched.append("fetch"), raising=False)
    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_model_dir), local_files_only=True, **model_mod.no_hub_kernels()
    )
    assert model.use_kernels is False
    with pytest.raises(ValueError, match="USE_HUB_KERNELS=NO"):
        hub_kernels.kernelize(model)
    assert fetched == []


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_base_model_loads_in_the_run_dtype(tiny_model_dir, monkeypatch, dtype):
    """The base is read straight into the run's dtype (no fp32 copy for bf16) with ``use_kernels=False``, and its
    values equal an fp32 load cast afterwards."""
    from transformers import AutoModelForCausalLM

    from dplora.contract.spec import ModelSection

    seen = []
    original = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.append({k: kwargs.get(k) for k in ("dtype", "use_kernels")})
        return original(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    model, _ = model_mod.load_base_model(
        ModelSection(path=str(tiny_model_dir)), torch.device("cpu"), dtype, False, log=lambda *_: None
    )
    want = torch.bfloat16 if dtype == "bf16" else torch.float32
    assert seen == [{"dtype": want, "use_kernels": False}]
    assert {p.dtype for p in model.parameters()} == {want}
    reference = original(str(tiny_model_dir), local_files_only=True, dtype=torch.float32).to(want)
    ref = dict(reference.named_parameters())
    assert all(torch.equal(p, ref[n]) for n, p in model.named_parameters())
