"""dplora export (issue 32.1): a merged model and the adapter folder with a signed manifest chained to the release;
verify checks the chain (a tampered byte of a shard → exit 3), redoes the merge given the base, another base is
refused, a control needs --allow-control, and the merged folder loads in plain transformers with the logits of
base + adapters."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import contract_dict, train_ok, write_contract
from typer.testing import CliRunner

from dplora.cli.app import app

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    tmp = tmp_path_factory.mktemp("export")
    return (
        train_ok(tmp, tiny_model_dir, tickets_csv, signing_key, name="dp"),
        train_ok(tmp, tiny_model_dir, tickets_csv, signing_key, name="ctl", privacy=dict(enabled=False)),
    )


def _export(run: Path, out: Path, key: Path, *extra: str):
    return runner.invoke(app, ["export", str(run), "--out", str(out), "--signing-key", str(key), *extra])


def _verify(run: Path, folder: Path, pub: Path, *extra: str):
    return runner.invoke(app, ["verify", str(run), "--public-key", str(pub), "--export", str(folder), *extra])


def _manifest(folder: Path) -> dict:
    envelope = json.loads((folder / "dplora-export.dsse.json").read_text())
    return json.loads(base64.b64decode(envelope["payload"]))


@pytest.fixture(scope="module")
def merged(runs, signing_key, tmp_path_factory):
    out = tmp_path_factory.mktemp("merged") / "served"
    result = _export(runs[0], out, signing_key[0], "--merge", "--public-key", str(signing_key[1]))
    assert result.exit_code == 0, result.output
    return out


def test_merged_export_signs_every_file_and_names_release_and_base(runs, merged, tiny_model_dir):
    manifest = _manifest(merged)
    assert manifest["predicateType"] == "https://dplora.dev/export/v1"
    files = sorted(p.name for p in merged.iterdir() if p.name != "dplora-export.dsse.json")
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(files)
    assert manifest["subject"] == [
        {"name": n, "digest": {"sha256": hashlib.sha256((merged / n).read_bytes()).hexdigest()}} for n in files
    ]
    pred = manifest["predicate"]
    payload = base64.b64decode(json.loads((runs[0] / "release.dsse.json").read_text())["payload"])
    assert pred["source_release"]["record_digest"]["sha256"] == hashlib.sha256(payload).hexdigest()
    assert pred["format"] == "merge" and pred["merge"]["dtype"] == "float32" and pred["differentially_private"]
    recorded = json.loads(payload)["predicate"]["base_model"]["files"]
    assert pred["base_model"]["files"] == recorded
    assert (
        recorded["model.safetensors"] == hashlib.sha256((tiny_model_dir / "model.safetensors").read_bytes()).hexdigest()
    )


def test_merged_folder_loads_in_transformers_with_the_logits_of_base_plus_adapters(runs, merged, tiny_model_dir):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(str(merged)).eval()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    reference = PeftModel.from_pretrained(base, str(runs[0] / "adapter")).eval()
    ids = torch.tensor([[5, 17, 99, 200, 3, 42, 7, 1]])
    with torch.no_grad():
        got, want = plain(ids).logits, reference(ids).logits
    with reference.disable_adapter(), torch.no_grad():
        base_logits = reference(ids).logits
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()
    assert not torch.allclose(got, base_logits, rtol=1e-5, atol=1e-5)  # the adapters are in the merged weights


def test_verify_export_checks_the_chain_and_redoes_the_merge(runs, merged, signing_key, tiny_model_dir):
    result = _verify(runs[0], merged, signing_key[1])
    assert result.exit_code == 0, result.output
    assert "export chain" in result.output and "merge:" not in result.output
    result = _verify(runs[0], merged, signing_key[1], "--base-model", str(tiny_model_dir), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["export"]["merge_redone"] is True and doc["export"]["format"] == "merge"
    assert any(c["check"] == "merge" for c in doc["checks"])


def test_one_changed_byte_of_a_merged_shard_fails_verify_with_exit_3(merged, runs, signing_key, tmp_path):
    copy = tmp_path / "tampered"
    shutil.copytree(merged, copy)
    shard = copy / "model.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x01  # a weight byte, not the header
    shard.write_bytes(bytes(data))
    result = _verify(runs[0], copy, signing_key[1])
    assert result.exit_code == 3, result.output
    assert "model.safetensors: sha256 mismatch" in result.output


def test_verify_export_refuses_an_unsigned_file_and_another_release(merged, runs, signing_key, tmp_path):
    copy = tmp_path / "extra"
    shutil.copytree(merged, copy)
    (copy / "adapter_model.safetensors").write_bytes(b"x")
    result = _verify(runs[0], copy, signing_key[1])
    assert result.exit_code == 3 and "not covered by its manifest" in result.output, result.output
    result = _verify(runs[1], merged, signing_key[1], "--allow-non-private")
    assert result.exit_code == 3 and "names release record" in result.output, result.output


def test_export_refuses_another_base_and_writes_nothing(runs, signing_key, tmp_path):
    from tiny import save_tiny_model

    other = save_tiny_model(tmp_path / "other-base", seed=7)
    out = tmp_path / "served"
    result = _export(runs[0], out, signing_key[0], "--base-model", str(other))
    assert result.exit_code == 3, result.output
    assert "not the base this release was trained on" in result.output and "model.safetensors" in result.output
    assert not out.exists() and not list(tmp_path.glob(".served*"))


def test_a_base_folder_holding_an_adapter_is_refused(runs, signing_key, tmp_path, tiny_model_dir):
    """The recorded files match, but an extra adapter_config.json would make transformers load another adapter onto
    the base (red team): exit 2 on one line, nothing written."""
    import shutil

    base = tmp_path / "base-plus-adapter"
    shutil.copytree(tiny_model_dir, base)
    shutil.copy(runs[0] / "adapter" / "adapter_config.json", base / "adapter_config.json")
    out = tmp_path / "served"
    result = _export(runs[0], out, signing_key[0], "--base-model", str(base), "--public-key", str(signing_key[1]))
    assert result.exit_code == 2, result.output
    assert "holds an adapter_config.json" in result.output and "Traceback" not in result.output
    assert not out.exists() and not list(tmp_path.glob(".served*"))


def test_verify_with_another_base_model_exits_3(runs, merged, signing_key, tmp_path):
    from tiny import save_tiny_model

    other = save_tiny_model(tmp_path / "other-base", seed=7)
    result = _verify(runs[0], merged, signing_key[1], "--base-model", str(other))
    assert result.exit_code == 3 and "base model" in result.output, result.output


def test_peft_export_copies_the_adapter_folder_as_is_and_verifies(runs, signing_key, tmp_path):
    out = tmp_path / "adapter-export"
    result = _export(runs[0], out, signing_key[0], "--format", "peft")
    assert result.exit_code == 0, result.output
    adapter = runs[0] / "adapter"
    for p in adapter.iterdir():
        assert (out / p.name).read_bytes() == p.read_bytes()
    assert _manifest(out)["predicate"]["format"] == "peft"
    assert {s["name"] for s in _manifest(out)["subject"]} == {p.name for p in adapter.iterdir()}
    result = _verify(runs[0], out, signing_key[1])
    assert result.exit_code == 0, result.output


def test_a_control_is_refused_without_allow_control_and_labelled_with_it(runs, signing_key, tmp_path):
    out = tmp_path / "ctl-export"
    result = _export(runs[1], out, signing_key[0], "--format", "peft")
    assert result.exit_code == 6 and "--allow-control" in result.output, result.output
    assert not out.exists()
    result = _export(runs[1], out, signing_key[0], "--format", "peft", "--allow-control")
    assert result.exit_code == 0, result.output
    manifest = _manifest(out)
    assert manifest["predicateType"] == "https://dplora.dev/export-non-private/v1"
    assert manifest["predicate"]["differentially_private"] is False
    assert manifest["predicate"]["warning"] == "NO DP GUARANTEE"
    result = _verify(runs[1], out, signing_key[1], "--allow-non-private")
    assert result.exit_code == 0 and "NO DP GUARANTEE" in result.output, result.output


def test_export_bad_inputs_exit_2_in_one_line(runs, merged, signing_key, tmp_path):
    result = _export(runs[0], merged, signing_key[0])  # not empty
    assert result.exit_code == 2 and "not an empty folder" in result.output, result.output
    result = _export(runs[0], runs[0] / "inside", signing_key[0])
    assert result.exit_code == 2 and "outside the run folder" in result.output, result.output
    result = _export(runs[0], tmp_path / "x", signing_key[0], "--format", "gguf")
    assert result.exit_code == 2 and "allowed values are merge, peft" in result.output, result.output
    result = _verify(runs[0], tmp_path, signing_key[1])
    assert result.exit_code == 2 and "not a dplora export folder" in result.output, result.output


def test_a_conversations_run_on_a_model_without_a_template_exports_the_template_it_trained_with(
    tiny_model_dir, signing_key, tmp_path
):
    """The tiny model has no chat template, so conversations train through dplora's plain fallback: the merged
    export's tokenizer carries that template, so plain transformers renders a conversation as training and
    ``dplora generate`` do; a prompt/response run's export gets none (its records were raw text)."""
    from transformers import AutoTokenizer

    from dplora.data.chat import PLAIN_TEMPLATE

    chats = tmp_path / "chats.jsonl"
    turns = [[{"role": "user", "content": f"order {i} is late"}, {"role": "assistant", "content": "Sorry, checking."}]
             for i in range(40)]  # fmt: skip
    chats.write_text("".join(json.dumps({"messages": t}) + "\n" for t in turns))
    data = {"path": str(chats), "prompt_column": None, "response_column": None}
    cfg = write_contract(tmp_path / "chat.yaml", contract_dict(tiny_model_dir, chats, tmp_path / "chat", data=data))
    result = runner.invoke(app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert AutoTokenizer.from_pretrained(str(tiny_model_dir)).chat_template is None  # the premise
    out = tmp_path / "served"
    assert _export(tmp_path / "chat", out, signing_key[0], "--merge").exit_code == 0
    served = AutoTokenizer.from_pretrained(str(out))
    assert served.chat_template == PLAIN_TEMPLATE
    text = served.apply_chat_template(turns[0][:1], tokenize=False, add_generation_prompt=True)
    assert "order 0 is late" in text
    assert _verify(tmp_path / "chat", out, signing_key[1]).exit_code == 0  # the manifest signs the tokenizer as saved


def test_a_prompt_response_export_gets_no_template(merged):
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(merged)).chat_template is None
