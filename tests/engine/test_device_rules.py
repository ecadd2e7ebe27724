"""CUDA's device-mixing rules on the training path, on a CPU (``tests/devicerules.py``).

CI has no GPU. :class:`devicerules.CudaRules` makes dplora select ``cuda:0`` while the numbers stay on the CPU,
tags the storages that would live on CUDA and raises on every op that mixes them with a CPU tensor as CUDA would.
The harness is checked first (it raises, it lets CPU scalars through, it tags results); then full runs go through
it (fp32, bf16, gradient checkpointing, the ``auto`` batch probe with an out-of-memory retry, device-side noise);
then the historic fault, a probe batch built on the CPU, is planted and must fail.
"""

from __future__ import annotations

import pytest
import torch
from devicerules import CudaRules, DeviceMixError
from support.device_rules import shared_contract, train

from dplora.engine import gradcheck
from dplora.errors import TrainingFailedError
from dplora.recipe.config import RunOptions
from dplora.recipe.train import run_training

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


def test_rules_raise_on_a_cpu_tensor_beside_a_cuda_tensor():
    with CudaRules():
        cuda = torch.ones(3, 4, device="cuda")
        with pytest.raises(DeviceMixError, match="Expected all tensors to be on the same device"):
            cuda + torch.ones(3, 4)
        with pytest.raises(DeviceMixError):
            torch.nn.Embedding(10, 4).cuda()(torch.tensor([[1, 2]]))  # the index_select of a CPU batch
        with pytest.raises(DeviceMixError):  # a module never moved, fed a CUDA input
            torch.nn.Linear(4, 2)(cuda)


def test_rules_accept_cpu_scalars_moves_and_copies_and_tag_results():
    with CudaRules() as rules:
        assert torch.cuda.is_available()
        cuda = torch.ones(3, 4, device="cuda")
        host = torch.ones(3, 4)
        assert cuda.device.type == "cuda" and host.device.type == "cpu"
        assert (cuda + torch.tensor(2.0)).device.type == "cuda"  # a 0-dim CPU tensor may mix, as on CUDA
        moved = host.to(cuda.device)
        assert moved.device.type == "cuda" and host.device.type == "cpu" and rules.transfers == 1
        assert (cuda * moved).sum().device.type == "cuda"
        assert (cuda + moved).cpu().device.type == "cpu"
        cuda.copy_(host)  # copy_ across devices is legal on CUDA
        assert torch.zeros_like(cuda).device.type == "cuda" and cuda.new_zeros(2).device.type == "cuda"
        assert cuda[torch.tensor([0, 2])].device.type == "cuda"  # CPU indices are accepted by aten.index
        layer = torch.nn.Linear(4, 2).to(torch.device("cuda", 0))
        x = torch.randn(5, 4, device=cuda.device, requires_grad=True)
        layer(x).pow(2).sum().backward()  # backward ops are checked and tagged too
        assert layer.weight.grad.device.type == "cuda" and x.grad.device.type == "cuda"
    assert not torch.cuda.is_available() and cuda.device.type == "cpu"  # everything is undone on exit


def test_a_probe_batch_built_on_the_cpu_fails(tmp_path, tiny_model_dir, tickets_csv, signing_key, monkeypatch):
    """The historic GPU fault, planted: the per-example check's synthetic batch built on the CPU while the model is
    on "cuda:0". Under the rules the run stops in setup with CUDA's own message; without them it trains."""
    real = gradcheck.batching

    class CpuBatching:  # only the check's batch builder changes; the loop's batches stay on the device
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def collate(records, pad_id, device="cpu"):
            return real.collate(records, pad_id, device=torch.device("cpu"))

    monkeypatch.setattr(gradcheck, "batching", CpuBatching())
    contract = shared_contract(tmp_path, tiny_model_dir, tickets_csv)
    with pytest.raises(TrainingFailedError, match="Expected all tensors to be on the same device") as info:
        train(contract, signing_key)
    assert isinstance(info.value.__cause__, DeviceMixError)
    assert "cuda:0" in str(info.value)  # the stage names the device it thought it was on
    plain = run_training(  # the same fault on a plain CPU run: invisible, the reason for the rules
        shared_contract(tmp_path / "plain", tiny_model_dir, tickets_csv),
        RunOptions(signing_key=signing_key[0], data_key=None, progress=False, threads=1),
        log=lambda *_: None,
    )
    assert plain.steps_done == 2
