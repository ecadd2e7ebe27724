"""Opening a signed in-toto statement: a DSSE v1 envelope file, its Ed25519 signature, the Statement v1 inside.

One opener for every signed file dplora writes: the release (``release.dsse.json``), a synthetic file's manifest
(``FILE.dsse.json``, :mod:`dplora.synth`) and an export's manifest (``dplora-export.dsse.json``, :mod:`dplora.export`).
The envelope is checked by securesystemslib (``dsse.Envelope.from_dict`` and ``Envelope.verify`` with an
``SSlibKey``): first under securesystemslib's key id rule, then the older raw-key rule, then an empty key id (DSSE
makes keyid optional; https://github.com/secure-systems-lab/dsse/blob/master/protocol.md). The payload must be an
in-toto Statement v1 (https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md) of an expected
predicate type. See :mod:`dplora.release.envelope` for how they are written.
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from securesystemslib import exceptions as sslib_errors
from securesystemslib.dsse import Envelope

from dplora.errors import BadInputError, VerificationError
from dplora.release.envelope import PAYLOAD_TYPE, STATEMENT_TYPE
from dplora.release.keys import KeyIdRule, key_id, legacy_key_id, sslib_keys


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpenedStatement:
    """A statement whose signature verified: the statement, the envelope it came in, and the key id rule matched."""

    statement: dict  # the in-toto Statement v1 (``_type`` and ``predicateType`` checked, nothing else)
    envelope: dict  # the DSSE envelope as read from the file
    key_id_rule: KeyIdRule


def short_digest(hex_digest: str) -> str:
    """The first 12 hex digits of a digest and an ellipsis, for one-line messages (a shorter one as it is)."""
    return hex_digest[:12] + "…" if len(hex_digest) > 12 else hex_digest


def sha256_mismatch(expected: str, found: str) -> str:
    """``sha256 mismatch (expected …, found …)`` with both hex digests shortened (:func:`short_digest`)."""
    return f"sha256 mismatch (expected {short_digest(expected)}, found {short_digest(found)})"


def read_envelope(path: Path) -> dict:
    """The DSSE envelope in ``path`` (JSON), its payload type checked, its signature NOT checked.

    Raises:
        BadInputError: the file cannot be read (exit 2).
        VerificationError: not JSON, or a payload type other than ``application/vnd.in-toto+json`` (exit 3).
    """
    try:
        env = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"cannot read release file {path}: {exc}") from None
    except json.JSONDecodeError:
        raise VerificationError(f"{Path(path).name} is not JSON") from None
    if not isinstance(env, dict) or env.get("payloadType") != PAYLOAD_TYPE:
        got = env.get("payloadType") if isinstance(env, dict) else None
        raise VerificationError(f"payloadType is {got!r}, expected {PAYLOAD_TYPE!r}")
    return env


def open_envelope(env: dict, public_key: Ed25519PublicKey) -> tuple[bytes, KeyIdRule]:
    """(payload bytes, key id rule) once securesystemslib's ``Envelope.verify`` accepts a signature by the key.

    Args:
        env: a DSSE envelope dict (:func:`read_envelope`).
        public_key: the Ed25519 (RFC 8032) public key the signature must verify under.
    Raises:
        VerificationError: no signatures, not a DSSE envelope, no signature under this key's ids, or none verifies.
    """
    sigs = env.get("signatures")
    if not isinstance(sigs, list) or not sigs or not all(isinstance(s, dict) for s in sigs):
        raise VerificationError("envelope has no signatures")
    try:
        base64.b64decode(env.get("payload", ""), validate=True)
        # DSSE makes keyid optional; securesystemslib needs the field, so a missing one reads as empty.
        plain = {**env, "signatures": [{**s, "keyid": s.get("keyid") or ""} for s in sigs]}
        envelope = Envelope.from_dict(copy.deepcopy(plain))
    except (binascii.Error, KeyError, TypeError, ValueError, sslib_errors.Error) as exc:
        raise VerificationError(f"not a DSSE envelope: {str(exc) or exc.__class__.__name__}") from None
    candidates = [(rule, key) for rule, key in sslib_keys(public_key) if key.keyid in envelope.signatures]
    if not candidates:
        ids = f"{short_digest(key_id(public_key))}, or {short_digest(legacy_key_id(public_key))}"
        raise VerificationError(f"no signature by this public key (keyid {ids} by the older raw-key rule)")
    for rule, key in candidates:
        try:
            envelope.verify([key], 1)
            return envelope.payload, rule
        except sslib_errors.Error:
            continue
    raise VerificationError("signature does not verify with this public key")


def open_statement(
    path: Path, public_key: Ed25519PublicKey, predicate_types: tuple[str, ...], *, what: str = ""
) -> OpenedStatement:
    """Read the DSSE envelope file ``path``, verify its signature by ``public_key``, decode the in-toto statement.

    Checks, in order: the envelope and its payload type (:func:`read_envelope`); a signature by ``public_key``
    (:func:`open_envelope`); the payload is JSON; ``_type`` is in-toto Statement v1; ``predicateType`` is one of
    ``predicate_types``. Subjects and predicate are the caller's to check.

    Args:
        path: the envelope file (``release.dsse.json``, ``FILE.dsse.json``, ``dplora-export.dsse.json``).
        public_key: the Ed25519 public key.
        predicate_types: the accepted predicate types; the first is the one a message names as expected.
        what: the file's name in messages (``""`` for a release, ``"manifest"``, ``"export manifest"``).
    Returns:
        :class:`OpenedStatement`.
    Raises:
        BadInputError: the file cannot be read (exit 2).
        VerificationError: the first failed check, in one line (exit 3).
    """
    env = read_envelope(path)
    payload, rule = open_envelope(env, public_key)
    lead = f"{what} " if what else ""
    try:
        statement = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise VerificationError(f"{lead}payload is not JSON") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise VerificationError(f"{what or 'payload'} is not an in-toto Statement v1 ({STATEMENT_TYPE})")
    if (ptype := statement.get("predicateType")) not in predicate_types:
        raise VerificationError(f"{lead}predicateType is {ptype!r}, expected {predicate_types[0]!r}")
    return OpenedStatement(statement=statement, envelope=env, key_id_rule=rule)
