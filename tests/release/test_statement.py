"""The one opener of signed in-toto statements (release, synthetic manifest, export manifest) and the one
``source_release`` block that synth and export write and check (issue 44, item 5)."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib.dsse import Envelope
from securesystemslib.signer import CryptoSigner

from dplora.errors import BadInputError, VerificationError
from dplora.release.derived import (
    check_same_privacy,
    check_source_release,
    release_payload,
    release_record_digest,
    source_release_entry,
)
from dplora.release.envelope import PAYLOAD_TYPE, STATEMENT_TYPE, sign_statement
from dplora.release.keys import KeyIdRule, key_id
from dplora.release.statement import open_statement, sha256_mismatch, short_digest

TYPES = ("https://example.org/a/v1", "https://example.org/b/v1")


def _statement(ptype=TYPES[0]):
    return {"_type": STATEMENT_TYPE, "subject": [], "predicateType": ptype, "predicate": {"x": 1}}


def _write(path, envelope):
    path.write_text(json.dumps(envelope), encoding="utf-8")
    return path


def _raw(payload: bytes, key) -> dict:
    envelope = Envelope(payload, PAYLOAD_TYPE, {})
    envelope.sign(CryptoSigner(key))
    return envelope.to_dict()


def test_a_signed_statement_opens_with_its_envelope_and_key_id_rule(tmp_path):
    key = Ed25519PrivateKey.generate()
    envelope = sign_statement(_statement(TYPES[1]), key)
    opened = open_statement(_write(tmp_path / "s.dsse.json", envelope), key.public_key(), TYPES)
    assert opened.statement == _statement(TYPES[1])
    assert opened.envelope == envelope
    assert opened.key_id_rule is KeyIdRule.SSLIB
    assert envelope["signatures"][0]["keyid"] == key_id(key.public_key())


@pytest.mark.parametrize(
    ("what", "not_json", "not_statement", "wrong_type"),
    [
        ("", "payload is not JSON", "payload is not an in-toto", "predicateType is"),
        ("manifest", "manifest payload is not JSON", "manifest is not an in-toto", "manifest predicateType is"),
        (
            "export manifest",
            "export manifest payload is not JSON",
            "export manifest is not an in-toto",
            "export manifest predicateType is",
        ),
    ],
)
def test_each_callers_messages_are_its_own(tmp_path, what, not_json, not_statement, wrong_type):
    key = Ed25519PrivateKey.generate()
    pub = key.public_key()
    path = tmp_path / "s.dsse.json"
    with pytest.raises(VerificationError) as err:
        open_statement(_write(path, _raw(b"not json", key)), pub, TYPES, what=what)
    assert str(err.value) == not_json
    with pytest.raises(VerificationError) as err:
        open_statement(_write(path, _raw(b'{"_type": "other"}', key)), pub, TYPES, what=what)
    assert str(err.value) == f"{not_statement} Statement v1 ({STATEMENT_TYPE})"
    with pytest.raises(VerificationError) as err:
        open_statement(_write(path, sign_statement(_statement("https://x/v1"), key)), pub, TYPES, what=what)
    assert str(err.value) == f"{wrong_type} 'https://x/v1', expected {TYPES[0]!r}"


def test_a_changed_payload_another_key_or_no_file_is_refused(tmp_path):
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    envelope = sign_statement(_statement(), key)
    changed = dict(envelope, payload=base64.b64encode(json.dumps(_statement(TYPES[1])).encode()).decode())
    with pytest.raises(VerificationError, match="^signature does not verify with this public key$"):
        open_statement(_write(tmp_path / "a.json", changed), key.public_key(), TYPES)
    with pytest.raises(VerificationError, match="^no signature by this public key"):
        open_statement(_write(tmp_path / "b.json", envelope), other.public_key(), TYPES)
    with pytest.raises(BadInputError, match="cannot read release file"):
        open_statement(tmp_path / "missing.json", key.public_key(), TYPES)
    with pytest.raises(VerificationError, match="^payloadType is 'text/plain'"):
        open_statement(_write(tmp_path / "c.json", dict(envelope, payloadType="text/plain")), key.public_key(), TYPES)


def test_digest_messages_shorten_to_twelve_hex_digits():
    a, b = "ab" * 32, "cd" * 32
    assert short_digest(a) == "abababababab…" and short_digest("abc") == "abc"
    assert sha256_mismatch(a, b) == "sha256 mismatch (expected abababababab…, found cdcdcdcdcdcd…)"


def test_the_source_release_block_names_the_payload_digest_and_is_checked(tmp_path):
    key = Ed25519PrivateKey.generate()
    statement = {**_statement("https://dplora.dev/release/v1"), "predicate": {"run_id": "r1"}}
    path = _write(tmp_path / "release.dsse.json", sign_statement(statement, key))
    payload, read = release_payload(path)
    assert read == statement
    entry = source_release_entry(payload, read, "run7")
    digest = hashlib.sha256(base64.b64decode(json.loads(path.read_text())["payload"])).hexdigest()
    assert entry == {
        "record_digest": {"sha256": digest},
        "predicate_type": "https://dplora.dev/release/v1",
        "run": "run7",
    }
    assert release_record_digest(tmp_path) == release_record_digest(path) == digest
    check_source_release({"source_release": entry}, tmp_path, what="export")
    with pytest.raises(VerificationError) as err:
        check_source_release({"source_release": {"record_digest": {"sha256": "0" * 64}}}, tmp_path, what="export")
    assert str(err.value) == f"the export names release record 000000000000…, but this release's is {digest[:12]}…"


def test_a_manifest_must_share_its_releases_privacy():
    check_same_privacy(True, True, non_private_type="np", what="export manifest")
    check_same_privacy(False, False, non_private_type="np", what="export manifest")
    with pytest.raises(VerificationError, match=r"^a non-private \(np\) synthetic manifest over a DP release$"):
        check_same_privacy(False, True, non_private_type="np", what="synthetic manifest")
    with pytest.raises(VerificationError, match="^a DP export manifest over a non-private control release$"):
        check_same_privacy(True, False, non_private_type="np", what="export manifest")
