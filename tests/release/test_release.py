"""Tests of dplora.release.envelope and dplora.release.verify: DSSE v1 + in-toto Statement v1 signing and
verification (no torch)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import rsa

from dplora.data import digest as digests
from dplora.errors import BadInputError, VerificationError
from dplora.release import envelope as rel
from dplora.release import keys as release_keys
from dplora.release.keys import KeyIdRule
from dplora.release.verify import verify_release

RECORD = {"run": "demo", "epsilon": 3.0, "delta": 1e-6, "note": "patient said hello", "data": {"digest": {}}}


@pytest.fixture()
def keys(tmp_path):
    priv, pub = release_keys.generate_keypair(tmp_path / "keys" / "signing.pem")
    return release_keys.load_private_key(priv), release_keys.load_public_key(pub)


@pytest.fixture()
def run_dir(tmp_path):
    out = tmp_path / "run"
    (out / "adapter").mkdir(parents=True)
    (out / "adapter" / "adapter_model.safetensors").write_bytes(b"\x00\x01weights" * 100)
    (out / "adapter" / "adapter_config.json").write_text('{"r": 8}')
    return out


def _artifacts(out):
    return [out / "adapter" / "adapter_model.safetensors", out / "adapter" / "adapter_config.json"]


def _release(out, private_key, record=RECORD):
    return rel.write_release(output_dir=out, record=record, artifact_files=_artifacts(out), private_key=private_key)


def _edit_envelope(path, fn):
    env = json.loads(path.read_text())
    fn(env)
    path.write_text(json.dumps(env))


def _verify_fails(path, public_key, match):
    with pytest.raises(VerificationError, match=match):
        verify_release(path, public_key)


def test_round_trip(run_dir, keys):
    priv, pub = keys
    path = _release(run_dir, priv)
    assert path == run_dir.resolve() / rel.RELEASE_FILENAME
    for target in (path, run_dir):
        result = verify_release(target, pub)
        assert result.key_id_rule is KeyIdRule.SSLIB and result.bundle and result.base_model_files == ()
        st = result.statement
        assert st["_type"] == rel.STATEMENT_TYPE and st["predicateType"] == rel.PREDICATE_TYPE
        names = [s["name"] for s in st["subject"]]
        assert names == ["adapter/adapter_config.json", "adapter/adapter_model.safetensors"]
        assert st["subject"][1]["digest"]["sha256"] == digests.sha256_file(_artifacts(run_dir)[0])
    env = json.loads(path.read_text())
    assert env["payloadType"] == rel.PAYLOAD_TYPE
    assert env["signatures"][0]["keyid"] == release_keys.key_id(pub)


def test_predicate_is_record_exactly(run_dir, keys):
    path = _release(run_dir, keys[0])
    env = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(env["payload"]))
    assert statement["predicate"] == RECORD
    assert set(statement) == {"_type", "subject", "predicateType", "predicate"}


def test_no_leftover_tmp(run_dir, keys):
    _release(run_dir, keys[0])
    _release(run_dir, keys[0])  # replacing an existing release is atomic too
    assert sorted(p.name for p in run_dir.iterdir()) == ["adapter", rel.RELEASE_FILENAME, rel.SIGSTORE_FILENAME]


def test_artifact_outside_output_dir(tmp_path, run_dir, keys):
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"x")
    with pytest.raises(BadInputError, match="not a file inside the output folder"):
        rel.write_release(output_dir=run_dir, record=RECORD, artifact_files=[outside], private_key=keys[0])
    with pytest.raises(BadInputError, match="at least one artifact"):
        rel.write_release(output_dir=run_dir, record=RECORD, artifact_files=[], private_key=keys[0])


def test_tamper_artifact_byte(run_dir, keys):
    path = _release(run_dir, keys[0])
    f = _artifacts(run_dir)[0]
    data = bytearray(f.read_bytes())
    data[5] ^= 1
    f.write_bytes(bytes(data))
    _verify_fails(path, keys[1], r"adapter/adapter_model\.safetensors: sha256 mismatch \(expected \w+…, found")


def test_tamper_artifact_deleted(run_dir, keys):
    path = _release(run_dir, keys[0])
    _artifacts(run_dir)[1].unlink()
    _verify_fails(path, keys[1], r"adapter/adapter_config\.json: file is missing")


def test_tamper_payload_without_resigning(run_dir, keys):
    path = _release(run_dir, keys[0])

    def edit(env):
        st = json.loads(base64.b64decode(env["payload"]))
        st["predicate"]["epsilon"] = 0.1
        env["payload"] = base64.b64encode(rel.canonical_json(st)).decode()

    _edit_envelope(path, edit)
    _verify_fails(path, keys[1], "signature does not verify with this public key")


def test_signature_from_another_key(tmp_path, run_dir, keys):
    path = _release(run_dir, keys[0])
    other = release_keys.load_private_key(release_keys.generate_keypair(tmp_path / "other.pem")[0])
    forged = rel.sign_statement(verify_release(path, keys[1]).statement, other)["signatures"][0]

    _edit_envelope(path, lambda env: env["signatures"][0].update(sig=forged["sig"]))
    _verify_fails(path, keys[1], "signature does not verify with this public key")
    _edit_envelope(path, lambda env: env.update(signatures=[forged]))
    _verify_fails(path, keys[1], "no signature by this public key")


def test_wrong_public_key(tmp_path, run_dir, keys):
    path = _release(run_dir, keys[0])
    other_pub = release_keys.load_public_key(release_keys.generate_keypair(tmp_path / "other.pem")[1])
    _verify_fails(path, other_pub, "no signature by this public key")


def test_payload_type_changed(run_dir, keys):
    path = _release(run_dir, keys[0])
    _edit_envelope(path, lambda env: env.update(payloadType="application/json"))
    _verify_fails(path, keys[1], "payloadType is 'application/json'")


@pytest.mark.parametrize("name", ["../escape.bin", "/etc/passwd", "adapter/../../x"])
def test_subject_name_escaping(run_dir, keys, name):
    (run_dir.parent / "escape.bin").write_bytes(b"x")
    statement = rel.build_statement(RECORD, {name: hashlib.sha256(b"x").hexdigest()})
    (run_dir / rel.RELEASE_FILENAME).write_text(json.dumps(rel.sign_statement(statement, keys[0])))
    _verify_fails(run_dir, keys[1], "is not a relative path inside the release folder")


def test_subject_symlink_escaping(tmp_path, run_dir, keys):
    (tmp_path / "outside.bin").write_bytes(b"x")
    (run_dir / "link.bin").symlink_to(tmp_path / "outside.bin")
    statement = rel.build_statement(RECORD, {"link.bin": hashlib.sha256(b"x").hexdigest()})
    (run_dir / rel.RELEASE_FILENAME).write_text(json.dumps(rel.sign_statement(statement, keys[0])))
    _verify_fails(run_dir, keys[1], "escapes the release folder")


def test_missing_release_is_bad_input(tmp_path, keys):
    with pytest.raises(BadInputError, match="cannot read release file"):
        verify_release(tmp_path, keys[1])


def test_canonical_json():
    a = rel.canonical_json({"b": [1, {"y": 2, "x": "é"}], "a": None})
    b = rel.canonical_json({"a": None, "b": [1, {"x": "é", "y": 2}]})
    assert a == b == '{"a":null,"b":[1,{"x":"é","y":2}]}'.encode()
    for bad in (float("nan"), float("inf")):
        with pytest.raises(BadInputError):
            rel.canonical_json({"epsilon": bad})


def test_pae_known_answer():
    # DSSE v1 protocol.md test vector, through securesystemslib's Envelope (what dplora signs)
    from securesystemslib.dsse import Envelope

    got = Envelope(b"hello world", "http://example.com/HelloWorld", {}).pae()
    assert got == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


def test_signature_over_hand_computed_pae(run_dir, keys):
    """Independent reference: the signature verifies with plain cryptography over the PAE built by hand."""
    env = json.loads(_release(run_dir, keys[0]).read_text())
    payload = base64.b64decode(env["payload"])
    pae = b"DSSEv1 %d %b %d %b" % (len(rel.PAYLOAD_TYPE), rel.PAYLOAD_TYPE.encode(), len(payload), payload)
    keys[1].verify(base64.b64decode(env["signatures"][0]["sig"]), pae)  # raises InvalidSignature if wrong
    assert payload == rel.canonical_json(json.loads(payload))


def test_key_ids_known_answer(keys):
    """securesystemslib's rule: sha256 of the canonical JSON of keytype, scheme and keyval; old rule: raw key."""
    from dplora.release.keys import legacy_key_id

    raw = keys[1].public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    canonical = '{"keytype":"ed25519","keyval":{"public":"' + raw.hex() + '"},"scheme":"ed25519"}'
    assert release_keys.key_id(keys[1]) == hashlib.sha256(canonical.encode()).hexdigest()
    assert legacy_key_id(keys[1]) == hashlib.sha256(raw).hexdigest() != release_keys.key_id(keys[1])


def test_keygen_mode_overwrite_and_load(tmp_path):
    old = os.umask(0)
    try:
        priv, pub = release_keys.generate_keypair(tmp_path / "a" / "b" / "k.pem")
    finally:
        os.umask(old)
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert pub == tmp_path / "a" / "b" / "k.pub"
    before = priv.read_bytes()
    with pytest.raises(BadInputError, match="already exists"):
        release_keys.generate_keypair(priv)
    assert priv.read_bytes() == before
    priv.chmod(0o644)
    release_keys.generate_keypair(priv, overwrite=True)
    assert priv.read_bytes() != before and stat.S_IMODE(priv.stat().st_mode) == 0o600
    key = release_keys.load_private_key(priv)
    assert release_keys.key_id(release_keys.load_public_key(pub)) == release_keys.key_id(key.public_key())


def test_load_private_key_env_and_errors(tmp_path, monkeypatch):
    monkeypatch.delenv(release_keys.SIGNING_KEY_ENV, raising=False)
    with pytest.raises(BadInputError, match="no signing key"):
        release_keys.load_private_key(None)
    priv, pub = release_keys.generate_keypair(tmp_path / "k.pem")
    monkeypatch.setenv(release_keys.SIGNING_KEY_ENV, str(priv))
    assert release_keys.load_private_key(None) is not None
    with pytest.raises(BadInputError):
        release_keys.load_private_key(pub)  # a public key is not a private key
    with pytest.raises(BadInputError, match="cannot read"):
        release_keys.load_private_key(tmp_path / "absent.pem")
    priv.chmod(0o644)
    with pytest.warns(UserWarning, match="readable by group or others"):
        release_keys.load_private_key(priv)
    with pytest.raises(BadInputError):
        release_keys.load_public_key(priv)
    rsa_pem = tmp_path / "rsa.pem"
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_pem.write_bytes(rsa_key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()))
    rsa_pem.chmod(0o600)
    with pytest.raises(BadInputError, match="not an Ed25519 key"):
        release_keys.load_private_key(rsa_pem)
    rsa_pem.write_text("not a pem")
    with pytest.raises(BadInputError, match="not an unencrypted PEM"):
        release_keys.load_private_key(rsa_pem)


def test_hmac_known_answer_and_keys(tmp_path):
    f = tmp_path / "train.jsonl"
    data = b'{"text": "secret"}\n' * 1000
    f.write_bytes(data)
    key1, key2 = b"k" * 32, b"j" * 32
    assert digests.hmac_sha256_file(f, key1) == hmac.new(key1, data, hashlib.sha256).hexdigest()
    assert digests.hmac_sha256_file(f, key1) != digests.hmac_sha256_file(f, key2)
    assert digests.sha256_file(f) == hashlib.sha256(data).hexdigest()


def test_data_digest_entry(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_bytes(b"row\n")
    unkeyed = rel.data_digest_entry([f], None)
    assert unkeyed["keyed"] is False and unkeyed["files"] == {} and unkeyed["algorithm"] is None
    keyed = rel.data_digest_entry([f], b"k" * 16)
    assert keyed["keyed"] is True and keyed["algorithm"] == "hmac-sha256(salt||data)"
    salt = bytes.fromhex(keyed["salt"])
    assert keyed["files"] == {"train.jsonl": hmac.new(b"k" * 16, salt + b"row\n", hashlib.sha256).hexdigest()}


def test_load_data_key(tmp_path, monkeypatch):
    monkeypatch.delenv(rel.DATA_KEY_ENV, raising=False)
    assert rel.load_data_key(None) is None
    short = tmp_path / "short.key"
    short.write_bytes(b"tooshort-secret\n")  # 15 bytes after the newline is stripped
    with pytest.raises(BadInputError, match="too short") as exc:
        rel.load_data_key(short)
    assert "tooshort-secret" not in str(exc.value)
    good = tmp_path / "good.key"
    good.write_bytes(b"0123456789abcdef\n")
    monkeypatch.setenv(rel.DATA_KEY_ENV, str(good))
    assert rel.load_data_key(None) == b"0123456789abcdef"
    with pytest.raises(BadInputError, match="absent.key"):
        rel.load_data_key(tmp_path / "absent.key")


def test_verify_data_files(tmp_path, run_dir, keys):
    data = tmp_path / "train.jsonl"
    data.write_bytes(b"row one\nrow two\n")
    key = b"s" * 32
    record = dict(RECORD, data={"digest": rel.data_digest_entry([data], key)})
    path = _release(run_dir, keys[0], record)
    verify_release(path, keys[1], data_files=[data], data_key=key)
    with pytest.raises(VerificationError, match="train.jsonl: data HMAC mismatch"):
        verify_release(path, keys[1], data_files=[data], data_key=b"t" * 32)
    with pytest.raises(BadInputError, match="without a data key"):
        verify_release(path, keys[1], data_files=[data])
    unkeyed = _release(run_dir, keys[0], dict(RECORD, data={"digest": rel.data_digest_entry([data], None)}))
    with pytest.raises(VerificationError, match="no keyed data digest"):
        verify_release(unkeyed, keys[1], data_files=[data], data_key=key)
    path = _release(run_dir, keys[0], record)
    data.write_bytes(b"row one\nrow 2\n")
    with pytest.raises(VerificationError, match="train.jsonl: data HMAC mismatch"):
        verify_release(path, keys[1], data_files=[data], data_key=key)


def test_two_releases_of_the_same_file_carry_different_digests(tmp_path):
    """Issue 41, item 3: with one data key, main wrote the same HMAC for the same file in every release, so two
    records told anyone whether the data changed between them (e.g. whether a deletion was honoured)."""
    f = tmp_path / "train.jsonl"
    f.write_bytes(b"row one\nrow two\n")
    key = b"k" * 32
    first, second = rel.data_digest_entry([f], key), rel.data_digest_entry([f], key)
    assert first["files"]["train.jsonl"] != second["files"]["train.jsonl"]
    assert first["salt"] != second["salt"]


def test_the_keyed_digest_is_hmac_of_a_fresh_salt_and_the_data(tmp_path):
    """HMAC-SHA256(key, salt ‖ data) (RFC 2104), the 32-byte salt from os.urandom in the record, recomputed here
    with the standard library; and the file's unsalted HMAC (main's digest) appears nowhere in the entry."""
    f = tmp_path / "train.jsonl"
    data = b'{"text": "secret"}\n' * 1000
    f.write_bytes(data)
    key = b"k" * 32
    entry = rel.data_digest_entry([f], key)
    salt = bytes.fromhex(entry["salt"])
    assert len(salt) == 32 and entry["algorithm"] == "hmac-sha256(salt||data)" and entry["keyed"] is True
    assert entry["files"] == {"train.jsonl": hmac.new(key, salt + data, hashlib.sha256).hexdigest()}
    assert hmac.new(key, data, hashlib.sha256).hexdigest() not in json.dumps(entry)


def test_verify_checks_the_salted_digest_and_still_reads_an_unsalted_one(tmp_path, run_dir, keys):
    data = tmp_path / "train.jsonl"
    data.write_bytes(b"row one\nrow two\n")
    key = b"s" * 32
    entry = rel.data_digest_entry([data], key)
    path = _release(run_dir, keys[0], dict(RECORD, data={"digest": entry}))
    verify_release(path, keys[1], data_files=[data], data_key=key)
    with pytest.raises(VerificationError, match="train.jsonl: data HMAC mismatch"):
        verify_release(path, keys[1], data_files=[data], data_key=b"t" * 32)
    other_salt = dict(entry, salt=rel.data_digest_entry([data], key)["salt"])  # a salt not the one digested
    path = _release(run_dir, keys[0], dict(RECORD, data={"digest": other_salt}))
    with pytest.raises(VerificationError, match="train.jsonl: data HMAC mismatch"):
        verify_release(path, keys[1], data_files=[data], data_key=key)
    for bad in ("ab", "zz" * 32, 7):
        path = _release(run_dir, keys[0], dict(RECORD, data={"digest": dict(entry, salt=bad)}))
        with pytest.raises(VerificationError, match="salt"):
            verify_release(path, keys[1], data_files=[data], data_key=key)
    unsalted = {
        "algorithm": "hmac-sha256",
        "keyed": True,
        "files": {"train.jsonl": digests.hmac_sha256_file(data, key)},
    }
    path = _release(run_dir, keys[0], dict(RECORD, data={"digest": unsalted}))  # a record written before issue 41
    verify_release(path, keys[1], data_files=[data], data_key=key)
    data.write_bytes(b"row one\nrow 2\n")
    with pytest.raises(VerificationError, match="train.jsonl: data HMAC mismatch"):
        verify_release(path, keys[1], data_files=[data], data_key=key)


LEGACY = Path(__file__).parent / "data" / "legacy_release"  # made by main at 92d03bb: raw-key key id, no bundle


def test_release_made_before_this_change_still_verifies(tmp_path):
    """A release signed by the old code (key id = sha256 of the raw key) verifies and says which rule matched."""
    from dplora.release.keys import legacy_key_id

    pub = release_keys.load_public_key(LEGACY / "signing.pub")
    env = json.loads((LEGACY / "run" / rel.RELEASE_FILENAME).read_text())
    assert env["signatures"][0]["keyid"] == legacy_key_id(pub) != release_keys.key_id(pub)
    result = verify_release(LEGACY / "run", pub)
    assert result.key_id_rule is KeyIdRule.RAW_KEY and result.bundle is False
    assert result.statement["predicate"]["accounting"]["epsilon_spent"] == pytest.approx(7.9998, abs=1e-4)
    with pytest.raises(VerificationError, match="records no base-model digests"):
        verify_release(LEGACY / "run", pub, base_model=tmp_path)
    copy = tmp_path / "copy"  # the old rule is no bypass: a changed byte still fails
    shutil.copytree(LEGACY / "run", copy)
    (copy / "contract.yaml").write_text((copy / "contract.yaml").read_text().replace("8.0", "0.5"))
    _verify_fails(copy, pub, r"contract\.yaml: sha256 mismatch")


@pytest.mark.parametrize("edit", [lambda s: s.update(keyid=""), lambda s: s.pop("keyid")])
def test_empty_or_missing_key_id_verifies_by_signature(run_dir, keys, edit):
    """DSSE makes keyid optional: an empty or absent one is checked by the signature alone."""
    path = _release(run_dir, keys[0])
    (run_dir / rel.SIGSTORE_FILENAME).unlink()
    _edit_envelope(path, lambda env: edit(env["signatures"][0]))
    assert verify_release(path, keys[1]).key_id_rule is KeyIdRule.NONE
    _edit_envelope(path, lambda env: env["signatures"][0].update(sig=base64.b64encode(b"\0" * 64).decode()))
    _verify_fails(path, keys[1], "signature does not verify with this public key")


def test_bundle_holds_the_same_envelope(run_dir, keys):
    """release.sigstore.json: bundle v0.3, public-key hint = key id, the very envelope; edits to it are caught."""
    path = _release(run_dir, keys[0])
    bundle = json.loads((run_dir / rel.SIGSTORE_FILENAME).read_text())
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert bundle["verificationMaterial"] == {"publicKey": {"hint": release_keys.key_id(keys[1])}, "tlogEntries": []}
    assert bundle["dsseEnvelope"] == json.loads(path.read_text())
    other = rel.sign_statement(rel.build_statement({"epsilon": 0.1}, {"x": "0" * 64}), keys[0])
    (run_dir / rel.SIGSTORE_FILENAME).write_text(json.dumps(dict(bundle, dsseEnvelope=other)))
    _verify_fails(run_dir, keys[1], "release.sigstore.json does not hold the envelope of release.dsse.json")
    (run_dir / rel.SIGSTORE_FILENAME).write_text(json.dumps(dict(bundle, mediaType="application/json")))
    _verify_fails(run_dir, keys[1], "not a Sigstore bundle v0.3")
    (run_dir / rel.SIGSTORE_FILENAME).unlink()
    assert verify_release(run_dir, keys[1]).bundle is False


def test_failed_write_leaves_neither_file(run_dir, keys, monkeypatch):
    """A crash between the two renames leaves no bundle without its envelope (and no temp files)."""
    real, calls = os.replace, []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(rel.os, "replace", flaky)
    with pytest.raises(OSError, match="disk full"):
        _release(run_dir, keys[0])
    assert sorted(p.name for p in run_dir.iterdir()) == ["adapter"]


def _base_record(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "llama"}')
    (base / "model.safetensors").write_bytes(b"weights" * 100)
    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF" * 100)
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(base.iterdir())}
    package = {"file": gguf.name, "sha256": hashlib.sha256(gguf.read_bytes()).hexdigest()}
    return base, gguf, dict(RECORD, base_model={"name_or_path": "org/m", "files": files, "package": package})


def test_verify_base_model(tmp_path, run_dir, keys):
    """--base-model: every recorded file in the folder, or one file (the packaged GGUF) by its digest."""
    base, gguf, record = _base_record(tmp_path)
    path = _release(run_dir, keys[0], record)
    assert verify_release(path, keys[1], base_model=base).base_model_files == ("config.json", "model.safetensors")
    assert verify_release(path, keys[1], base_model=gguf).base_model_files == ("model.Q4_1.gguf",)
    assert verify_release(path, keys[1], base_model=base / "model.safetensors").base_model_files == (
        "model.safetensors",
    )
    (base / "model.safetensors").write_bytes(b"weights" * 99 + b"weightX")
    with pytest.raises(VerificationError, match=r"model\.safetensors: sha256 mismatch .*pass that file"):
        verify_release(path, keys[1], base_model=base)
    (base / "model.safetensors").unlink()
    with pytest.raises(VerificationError, match=r"model\.safetensors is missing"):
        verify_release(path, keys[1], base_model=base)
    (tmp_path / "other.gguf").write_bytes(b"GGUF" * 99)
    with pytest.raises(VerificationError, match="other.gguf .*matches no recorded file"):
        verify_release(path, keys[1], base_model=tmp_path / "other.gguf")
    with pytest.raises(BadInputError, match="no such file or folder"):
        verify_release(path, keys[1], base_model=tmp_path / "absent")


def test_keygen_replaces_a_symlinked_public_key_instead_of_writing_through_it(tmp_path):
    """The public key goes through dplora.atomic (temp, fsync, rename): a symlink at its path is replaced, never
    followed, so the file it pointed at keeps its bytes (a plain write_bytes wrote the key into it)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("not a key\n")
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "k.pub").symlink_to(victim)
    (keys / "k.pem").write_text("old\n")
    priv, pub = release_keys.generate_keypair(keys / "k.pem", overwrite=True)
    assert victim.read_text() == "not a key\n"
    assert not pub.is_symlink() and stat.S_IMODE(pub.stat().st_mode) == 0o644
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert release_keys.load_private_key(priv).public_key().public_bytes(
        ser.Encoding.Raw, ser.PublicFormat.Raw
    ) == release_keys.load_public_key(pub).public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    assert not [p.name for p in keys.iterdir() if p.name.endswith(".tmp")]


def test_keygen_leaves_no_half_pair_when_the_public_key_cannot_be_written(tmp_path, monkeypatch):
    """A failing public-key write removes the new private key: the pair is whole or absent."""
    from dplora import atomic

    real = atomic.write_bytes

    def failing(path, data, **kw):
        if str(path).endswith(".pub"):
            raise OSError(5, "Input/output error")
        return real(path, data, **kw)

    monkeypatch.setattr(atomic, "write_bytes", failing)
    with pytest.raises(BadInputError, match="cannot write key file"):
        release_keys.generate_keypair(tmp_path / "k.pem")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
