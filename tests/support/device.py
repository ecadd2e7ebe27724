"""Helpers shared by tests/engine/test_device.py and its slow tier under tests/slow/."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import dplora
from dplora.contract.loader import parse_contract

PACKAGE = str(Path(dplora.__file__).parent)  # every dplora module (the package root, not one stage)


FACTORIES = {
    torch.zeros,
    torch.ones,
    torch.full,
    torch.empty,
    torch.tensor,
    torch.as_tensor,
    torch.arange,
    torch.randn,
    torch.rand,
    torch.randint,
    torch.normal,
    torch.eye,
    torch.linspace,
}


class DevicePolice(torch.overrides.TorchFunctionMode):
    """Record every tensor-creating call made from dplora's own code without ``device=``, and every tensor a
    dplora call returns on a device other than ``device``."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = torch.device(device)
        self.violations: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        frame = sys._getframe(1)
        ours = frame.f_code.co_filename.startswith(PACKAGE)
        where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {getattr(func, '__name__', func)}"
        if ours and func in FACTORIES and kwargs.get("device") is None:
            self.violations.append(f"no device: {where}")
        out = func(*args, **kwargs)
        if ours and isinstance(out, torch.Tensor) and out.device.type != self.device.type:
            self.violations.append(f"on {out.device}: {where}")
        return out


def shared_contract(tmp_path, model_dir, data_csv, **model):
    return parse_contract(
        {
            "privacy": {
                "protected_unit": "user",
                "unit_key": "customer_id",
                "adjacency": "add_remove",
                "target_epsilon": 50.0,
                "delta": 1e-5,
                "accountant": "rdp",
                "max_grad_norm": 1.0,
                "noise_multiplier": 1.0,
                "num_units": 40,  # a public N (add/remove releases need it declared): the fixture's ~40 customers
            },
            "model": {"path": str(model_dir), **model},
            "data": {"path": str(data_csv), "prompt_column": "message", "response_column": "reply"},
            "lora": {"r": 4, "alpha": 8},
            "training": {
                "expected_batch_size": 8,
                "physical_batch_size": 4,
                "steps": 2,
                "lr": 0.01,
                "max_seq_len": 24,
                "output_dir": str(tmp_path / "run"),
            },
        }
    )
