"""The slow tier of tests/engine/test_device.py, whose docstring describes the module."""

from __future__ import annotations

import json

import pytest
import torch
from support.device import DevicePolice, shared_contract

from dplora.recipe.config import RunOptions
from dplora.recipe.train import run_training

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


def test_every_engine_tensor_names_its_device(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """A full run (probe, unit-level steps split across physical batches, noise, release) under DevicePolice.

    On the code before issue 10 this fails at the probe: ``batching.collate`` built its batch with ``torch.full``
    and no device (``no device: engine.py:… full``), which is the index_select mismatch seen on cuda:0.
    """
    contract = shared_contract(tmp_path, tiny_model_dir, tickets_csv)
    police = DevicePolice(torch.device("cpu"))
    with police:
        result = run_training(
            contract,
            RunOptions(signing_key=signing_key[0], data_key=None, progress=False, threads=1),
            log=lambda *_: None,
        )
    assert police.violations == []
    assert result.steps_done == 2


def test_bf16_run_records_its_dtype(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """model.dtype=bf16 on CPU trains, verifies, and the signed record names the dtype and the generator."""
    from typer.testing import CliRunner

    from dplora.cli.app import app

    contract = shared_contract(tmp_path, tiny_model_dir, tickets_csv, dtype="bf16")
    result = run_training(
        contract, RunOptions(signing_key=signing_key[0], data_key=None, progress=False, threads=1), log=lambda *_: None
    )
    envelope = json.loads(result.release_path.read_text())
    import base64

    record = json.loads(base64.b64decode(envelope["payload"]))["predicate"]
    execution = record["execution"]
    assert execution["base_dtype"] == "bf16" and execution["lora_dtype"] == "fp32"
    assert execution["device_type"] == "cpu" and execution["allow_tf32"] is False
    assert "ChaCha20" in execution["noise_generator"] and "os.urandom" in execution["noise_generator"]
    assert "cpu device" in execution["noise_generator"] and "floating point" in execution["noise_floating_point_note"]
    assert record["model"]["dtype"] == "bf16"
    verify = CliRunner().invoke(app, ["verify", str(result.output_dir), "--public-key", str(signing_key[1])])
    assert verify.exit_code == 0, verify.output
