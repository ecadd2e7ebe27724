"""Helpers shared by tests/engine/test_device.py and its slow tier under tests/slow/."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import dplora
from support import device_rules

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
    """support.device_rules' user-level contract, ``model`` updating its model section."""
    return device_rules.shared_contract(tmp_path, model_dir, data_csv, model=model)
