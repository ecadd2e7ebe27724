"""Issue 42.3: peft conventions. The signed release's ``adapter_config.json`` keeps a name for a local base (the
folder's name, never a machine path); ``export --format peft --local-base`` writes a copy for this machine whose
config names the verified base folder, so that ``AutoPeftModelForCausalLM.from_pretrained(copy)`` loads offline
with the logits of ``PeftModel.from_pretrained(base, release adapter)``."""

from __future__ import annotations

import base64
import json
import shutil

import pytest
from conftest import contract_dict, write_contract
from support.peft_logits import logits_auto_manual_base
from typer.testing import CliRunner

from dplora.cli.app import app

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    tmp = tmp_path_factory.mktemp("local-base")
    cfg = write_contract(tmp / "c.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp / "run"))
    result = runner.invoke(app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"])
    assert result.exit_code == 0, result.output
    return tmp / "run"


def _export(run, out, key, *extra):
    return runner.invoke(app, ["export", str(run), "--out", str(out), "--signing-key", str(key), *extra])


def test_the_release_names_the_base_by_name_never_a_path(run, tiny_model_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants
    from peft import AutoPeftModelForCausalLM

    config = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == tiny_model_dir.name
    assert str(tiny_model_dir.parent) not in (run / "adapter" / "adapter_config.json").read_text()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once at import
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OSError):  # the documented limit: a name alone is looked up here, then on the Hub
        AutoPeftModelForCausalLM.from_pretrained(str(run / "adapter"))


def test_auto_peft_loads_the_local_base_copy_offline(run, tiny_model_dir, signing_key, tmp_path, monkeypatch):
    import torch
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "served" / "adapter"
    result = _export(run, out, signing_key[0], "--format", "peft", "--local-base")
    assert result.exit_code == 0, result.output
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_model_dir.resolve())
    envelope = json.loads((out / "dplora-export.dsse.json").read_text())
    manifest = base64.b64decode(envelope["payload"]).decode()
    assert json.loads(manifest)["predicate"]["local_base"] is True
    assert str(tiny_model_dir) not in manifest  # the path is in the local copy only, not in the signed manifest
    check = runner.invoke(app, ["verify", str(run), "--public-key", str(signing_key[1]), "--export", str(out)])
    assert check.exit_code == 0, check.output

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # not the base's parent: the name resolves by its absolute path
    auto = AutoPeftModelForCausalLM.from_pretrained(str(out))
    manual = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(run / "adapter"))
    got, want, base = logits_auto_manual_base(auto, manual)
    torch.testing.assert_close(got, want)
    assert (got - base).abs().max() > 0


def test_local_base_refuses_another_base_and_a_merge(run, signing_key, tmp_path, tiny_model_dir):
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    (other / "config.json").write_text((other / "config.json").read_text().replace("}", ', "x": 1}', 1))
    out = tmp_path / "a"
    refused = _export(run, out, signing_key[0], "--format", "peft", "--local-base", "--base-model", str(other))
    assert refused.exit_code == 3 and "not the base this release was trained on" in refused.output
    assert not out.exists()
    merge = _export(run, tmp_path / "b", signing_key[0], "--local-base")
    assert merge.exit_code == 2 and "--local-base goes with --format peft" in merge.output


def test_export_and_verify_export_print_no_library_future_warning(run, signing_key, tmp_path, tiny_model_dir):
    """Issue 42.10: transformers' `is_gradient_checkpointing` FutureWarning (asked by peft) is not the user's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = tmp_path / "served"
    cmds = [
        ["export", str(run), "--merge", "--out", str(out), "--signing-key", str(signing_key[0])],
        [
            "verify",
            str(run),
            "--public-key",
            str(signing_key[1]),
            "--export",
            str(out),
            "--base-model",
            str(tiny_model_dir),
        ],
    ]
    for args in cmds:
        done = subprocess.run(
            [sys.executable, "-m", "dplora", *args], capture_output=True, text=True, env=env, timeout=600
        )
        assert done.returncode == 0, done.stderr
        assert "FutureWarning" not in done.stderr and "is_gradient_checkpointing" not in done.stderr
    assert "OK  merge" in done.stdout
