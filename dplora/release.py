"""Signed release records: an in-toto Statement v1 in a DSSE v1 envelope, signed with Ed25519.

Envelope (``release.dsse.json``): DSSE v1 (https://github.com/secure-systems-lab/dsse/blob/master/protocol.md);
the Ed25519 (RFC 8032) signature covers the Pre-Authentication Encoding (PAE) of ``payloadType`` and
the payload. Payload: the canonical JSON of an in-toto Statement v1
(https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md) whose subjects are the
released artifact files (path relative to the release folder + sha256).

Predicate type ``https://dplora.dev/release/v1``: the predicate is the trainer's record dict,
written verbatim (nothing is added). Its ``data.digest`` entry, when present, comes from
:func:`data_digest_entry`: an HMAC-SHA256 (RFC 2104) per data file under the data owner's key,
never a plain hash, since a plain hash of private data would let anyone confirm a guess of it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import tempfile
import warnings
from pathlib import Path, PurePosixPath

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from dplora.errors import BadInputError, VerificationError

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://dplora.dev/release/v1"
RELEASE_FILENAME = "release.dsse.json"
SIGNING_KEY_ENV = "DPLORA_SIGNING_KEY"  # path to the private key PEM
DATA_KEY_ENV = "DPLORA_DATA_KEY"  # path to the data owner's HMAC key file
MIN_DATA_KEY_BYTES = 16
NO_SIGNING_KEY = "no signing key: pass --signing-key PATH or set DPLORA_SIGNING_KEY; "
NO_SIGNING_KEY += "create one with `dplora keygen`"


def canonical_json(obj) -> bytes:
    """Canonical JSON (sorted keys, no whitespace, UTF-8, no NaN/Infinity): the bytes that are signed.

    Args:
        obj: A JSON-serializable value.
    Returns:
        UTF-8 encoded JSON.
    Raises:
        BadInputError: If ``obj`` holds NaN/Infinity or a value JSON cannot represent.
    """
    try:
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError) as exc:
        raise BadInputError(f"release record is not canonical JSON: {exc}") from None
    return text.encode("utf-8")


def _stream(path: Path, h):
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    """Hex SHA-256 (FIPS 180-4) of a file, streamed in 1 MiB chunks.

    Args:
        path: The file to hash.
    Returns:
        The lowercase hex digest.
    Raises:
        OSError: If the file cannot be read.
    """
    return _stream(path, hashlib.sha256())


def hmac_sha256_file(path: Path, key: bytes) -> str:
    """Hex HMAC-SHA256 (RFC 2104) of a file, streamed in 1 MiB chunks.

    Args:
        path: The file to digest.
        key: The data owner's secret key.
    Returns:
        The lowercase hex MAC.
    Raises:
        OSError: If the file cannot be read.
    """
    return _stream(path, hmac.new(key, digestmod=hashlib.sha256))


def load_data_key(path: Path | None) -> bytes | None:
    """Load the data owner's HMAC (RFC 2104) key from ``path``, else ``$DPLORA_DATA_KEY``, else None.

    Args:
        path: Key file (raw bytes; one trailing newline is stripped), or None to use the environment.
    Returns:
        The key bytes, or None when no key was given.
    Raises:
        BadInputError: If the file cannot be read or holds under 16 bytes (names the path, never the key).
    """
    if path is None:
        if not (env := os.environ.get(DATA_KEY_ENV, "").strip()):
            return None
        path = Path(env)
    try:
        key = Path(path).read_bytes().removesuffix(b"\n").removesuffix(b"\r")
    except OSError as exc:
        raise BadInputError(f"cannot read data key file {path}: {exc.strerror or exc}") from None
    if len(key) < MIN_DATA_KEY_BYTES:
        raise BadInputError(f"data key in {path} is too short: need at least {MIN_DATA_KEY_BYTES} bytes")
    return key


def data_digest_entry(data_files: list[Path], key: bytes | None) -> dict:
    """The record's ``data.digest`` entry: HMAC-SHA256 (RFC 2104) per file by basename, or none without a key.

    Args:
        data_files: The training data files.
        key: The data owner's HMAC key, or None.
    Returns:
        ``{"algorithm", "keyed", "files": {basename: hex}, "note"}``.
    Raises:
        BadInputError: If two data files share a basename.
        OSError: If a data file cannot be read.
    """
    if key is None:
        note = "no data key was given: the data digest is omitted "
        note += "(a plain hash of private data would let anyone confirm a guess)"
        return {"algorithm": None, "keyed": False, "files": {}, "note": note}
    files: dict[str, str] = {}
    for p in map(Path, data_files):
        if p.name in files:
            raise BadInputError(f"two data files share the name {p.name}: the data digest is keyed by name")
        files[p.name] = hmac_sha256_file(p, key)
    note = "keyed digest; the data owner holds the key"
    return {"algorithm": "hmac-sha256", "keyed": True, "files": files, "note": note}


def generate_keypair(
    private_path: Path, public_path: Path | None = None, *, overwrite: bool = False
) -> tuple[Path, Path]:
    """Create an Ed25519 (RFC 8032) key pair as PEM files (parent folders are created).

    Args:
        private_path: Where to write the private key: PKCS8, unencrypted, mode exactly 0600.
        public_path: Where to write the SubjectPublicKeyInfo public key; default: suffix ``.pub``.
        overwrite: Replace existing files instead of refusing.
    Returns:
        ``(private_path, public_path)``.
    Raises:
        BadInputError: If a target exists and ``overwrite`` is False, or a file cannot be written.
    """
    private_path = Path(private_path)
    public_path = Path(public_path) if public_path is not None else private_path.with_suffix(".pub")
    for p in () if overwrite else (private_path, public_path):
        if p.exists():
            raise BadInputError(f"{p} already exists; pass --overwrite to replace it, or choose another path")
    key = Ed25519PrivateKey.generate()
    priv_pem = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    pub_pem = key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        for p in (private_path, public_path):
            p.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(private_path, flags, 0o600), "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # exactly 0600 whatever the umask or an old file's mode
            f.write(priv_pem)
        public_path.write_bytes(pub_pem)
    except OSError as exc:
        raise BadInputError(f"cannot write key file: {exc}") from None
    return private_path, public_path


def _load_pem(path: Path, what: str, loader, key_type):
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BadInputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        key = loader(data)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise BadInputError(f"{what} {path} is not an unencrypted PEM {what}") from None
    if not isinstance(key, key_type):
        raise BadInputError(f"{what} {path} is not an Ed25519 key")
    return key


def load_private_key(path: Path | None) -> Ed25519PrivateKey:
    """Load a PEM Ed25519 (RFC 8032) private key; warns (``UserWarning``) if group/world readable.

    Args:
        path: Unencrypted PEM private key path, or None to use ``$DPLORA_SIGNING_KEY``.
    Returns:
        The private key.
    Raises:
        BadInputError: If no key is given, or the file is unreadable, not PEM, encrypted, or not Ed25519.
    """
    if path is None:
        if not (env := os.environ.get(SIGNING_KEY_ENV, "").strip()):
            raise BadInputError(NO_SIGNING_KEY)
        path = Path(env)
    key = _load_pem(path, "private key", lambda d: ser.load_pem_private_key(d, None), Ed25519PrivateKey)
    if os.stat(path).st_mode & 0o044:
        warnings.warn(f"signing key {path} is readable by group or others; chmod 600 it", stacklevel=2)
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Load a PEM SubjectPublicKeyInfo Ed25519 (RFC 8032) public key.

    Args:
        path: Public key path.
    Returns:
        The public key.
    Raises:
        BadInputError: If the file is missing or unreadable, not a PEM public key, or not Ed25519.
    """
    return _load_pem(path, "public key", ser.load_pem_public_key, Ed25519PublicKey)


def key_id(public_key: Ed25519PublicKey) -> str:
    """The DSSE ``keyid``: hex SHA-256 of the raw 32-byte Ed25519 (RFC 8032) public key.

    Args:
        public_key: An Ed25519 public key.
    Returns:
        The lowercase hex key id.
    """
    return hashlib.sha256(public_key.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)).hexdigest()


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 (protocol.md) PAE: ``"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body``, decimal lengths.

    Args:
        payload_type: The envelope's payloadType.
        payload: The raw (not base64) payload bytes.
    Returns:
        The bytes that are signed.
    """
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(t), t, len(payload), payload)


def build_statement(record: dict, subjects: dict[str, str]) -> dict:
    """Build an in-toto Statement v1 with predicate type ``PREDICATE_TYPE``.

    Args:
        record: The run record, used verbatim as the predicate.
        subjects: ``{relative name: sha256 hex}`` of the released artifacts.
    Returns:
        The statement dict, subjects sorted by name.
    """
    subject = [{"name": n, "digest": {"sha256": subjects[n]}} for n in sorted(subjects)]
    return {"_type": STATEMENT_TYPE, "subject": subject, "predicateType": PREDICATE_TYPE, "predicate": record}


def sign_statement(statement: dict, private_key: Ed25519PrivateKey) -> dict:
    """Sign a statement into a DSSE v1 envelope: Ed25519 (RFC 8032) over PAE of the canonical JSON.

    Args:
        statement: The in-toto Statement v1 dict.
        private_key: The Ed25519 signing key.
    Returns:
        ``{"payloadType", "payload" (base64), "signatures": [{"keyid", "sig" (base64)}]}``.
    Raises:
        BadInputError: If the statement is not canonical-JSON serializable.
    """
    payload = canonical_json(statement)
    sig = base64.b64encode(private_key.sign(pae(PAYLOAD_TYPE, payload))).decode("ascii")
    signature = {"keyid": key_id(private_key.public_key()), "sig": sig}
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode("ascii"),
        "signatures": [signature],
    }


def write_release(*, output_dir: Path, record: dict, artifact_files: list[Path], private_key) -> Path:
    """Sign ``record`` + artifact sha256s (DSSE v1, in-toto Statement v1) as ``release.dsse.json``.

    The write is atomic: a temp file in the same folder, fsync, then ``os.replace``.

    Args:
        output_dir: The run's output folder; subject names are POSIX paths relative to it.
        record: The predicate, written verbatim.
        artifact_files: Files to list as subjects; each must be a file inside ``output_dir``.
        private_key: The Ed25519 signing key.
    Returns:
        The path of the written envelope.
    Raises:
        BadInputError: If no artifact is given, one is missing or outside ``output_dir``, or bad JSON.
    """
    root = Path(output_dir).resolve()
    subjects: dict[str, str] = {}
    for a in map(Path, artifact_files):
        p = (a if a.is_absolute() else root / a).resolve()
        if not p.is_relative_to(root) or p == root or p == root / RELEASE_FILENAME:
            raise BadInputError(f"artifact {a} is not a file inside the output folder {output_dir}")
        if not p.is_file():
            raise BadInputError(f"artifact {a} is missing or not a file")
        subjects[p.relative_to(root).as_posix()] = sha256_file(p)
    if not subjects:
        raise BadInputError("a release needs at least one artifact file")
    envelope = sign_statement(build_statement(record, subjects), private_key)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{RELEASE_FILENAME}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write((json.dumps(envelope, indent=2, sort_keys=True) + "\n").encode("utf-8"))
            f.flush()
            os.fchmod(f.fileno(), 0o644)
            os.fsync(f.fileno())
        os.replace(tmp, root / RELEASE_FILENAME)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return root / RELEASE_FILENAME


def _short(hex_digest: str) -> str:
    return hex_digest[:12] + "…" if len(hex_digest) > 12 else hex_digest


def _open_envelope(path: Path, public_key: Ed25519PublicKey) -> bytes:
    try:
        env = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"cannot read release file {path}: {exc}") from None
    except json.JSONDecodeError:
        raise VerificationError(f"{path.name} is not JSON") from None
    if not isinstance(env, dict) or env.get("payloadType") != PAYLOAD_TYPE:
        got = env.get("payloadType") if isinstance(env, dict) else None
        raise VerificationError(f"payloadType is {got!r}, expected {PAYLOAD_TYPE!r}")
    try:
        payload = base64.b64decode(env.get("payload", ""), validate=True)
    except (ValueError, TypeError):
        raise VerificationError("payload is not valid base64") from None
    sigs = env.get("signatures")
    if not isinstance(sigs, list) or not sigs:
        raise VerificationError("envelope has no signatures")
    kid = key_id(public_key)
    mine = [s for s in sigs if isinstance(s, dict) and s.get("keyid") in (kid, "", None)]
    if not mine:
        raise VerificationError(f"no signature by this public key (keyid {_short(kid)})")
    for s in mine:
        try:
            public_key.verify(base64.b64decode(s.get("sig", ""), validate=True), pae(PAYLOAD_TYPE, payload))
            return payload
        except (InvalidSignature, ValueError, TypeError):
            continue
    raise VerificationError("signature does not verify with this public key")


def _check_subject(folder: Path, subject) -> None:
    ok = isinstance(subject, dict) and isinstance(subject.get("digest"), dict)
    name, digest = (subject.get("name"), subject["digest"].get("sha256")) if ok else (None, None)
    if not isinstance(name, str) or not name or not isinstance(digest, str):
        raise VerificationError(f"malformed subject in statement: {str(subject)[:80]}")
    if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
        raise VerificationError(f"subject name {name!r} is not a relative path inside the release folder")
    path = (folder / name).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise VerificationError(f"subject name {name!r} escapes the release folder")
    if not path.is_file():
        raise VerificationError(f"{name}: file is missing")
    if not hmac.compare_digest(found := sha256_file(path), digest.lower()):
        raise VerificationError(f"{name}: sha256 mismatch (expected {_short(digest)}, found {_short(found)})")


def _check_data(predicate, data_files: list[Path], data_key: bytes) -> None:
    data = predicate.get("data") if isinstance(predicate, dict) else None
    digest = data.get("digest") if isinstance(data, dict) else None
    files = digest.get("files") if isinstance(digest, dict) and digest.get("keyed") is True else None
    if not isinstance(files, dict):
        raise VerificationError("the release has no keyed data digest to check the data files against")
    for p in map(Path, data_files):
        if p.name not in files:
            raise VerificationError(f"{p.name}: not in the release's data digest")
        try:
            found = hmac_sha256_file(p, data_key)
        except OSError as exc:
            raise BadInputError(f"cannot read data file {p}: {exc.strerror or exc}") from None
        if not hmac.compare_digest(found, str(files[p.name]).lower()):
            raise VerificationError(f"{p.name}: data HMAC mismatch (wrong data file or wrong data key)")


UNSIGNED_BY_DESIGN = ("metrics.jsonl",)  # per-step training log beside the release; never part of it


def _check_no_unsigned_files(folder: Path, signed: set[str], envelope_name: str) -> None:
    """Refuse files the signature does not cover (an extra file in adapter/ would be loaded by peft)."""
    allowed = signed | {envelope_name, *UNSIGNED_BY_DESIGN}
    for p in sorted(folder.rglob("*")):
        name = p.relative_to(folder).as_posix()
        if p.is_file() and name not in allowed:
            raise VerificationError(f"{name}: file is not covered by the signature (remove it or re-release)")


def verify_release(
    release_path: Path, public_key, *, data_files: list[Path] | None = None, data_key: bytes | None = None
) -> dict:
    """Verify a release: DSSE v1 envelope, Ed25519 (RFC 8032) signature, in-toto Statement v1, files.

    Checks, in order: envelope and payloadType; a signature by ``public_key`` over PAE; the statement
    and predicate type; each subject file's sha256 (names must stay inside the folder); with
    ``data_files`` and ``data_key``, each data file's HMAC-SHA256 (RFC 2104) by basename.

    Args:
        release_path: The envelope file, or the folder holding ``release.dsse.json``.
        public_key: An Ed25519 public key, or a path to a PEM public key.
        data_files: Data files to check against the record's keyed ``data.digest``.
        data_key: The data owner's HMAC key; required with ``data_files``.
    Returns:
        The verified statement dict.
    Raises:
        BadInputError: If the release file or key cannot be read, or ``data_files`` come without a key.
        VerificationError: On the first mismatch, with a one-line reason naming it.
    """
    path = Path(release_path)
    path = path / RELEASE_FILENAME if path.is_dir() else path
    if not isinstance(public_key, Ed25519PublicKey):
        public_key = load_public_key(Path(public_key))
    if data_files and data_key is None:
        raise BadInputError("data files were given without a data key: pass --data-key or set DPLORA_DATA_KEY")
    payload = _open_envelope(path, public_key)
    try:
        statement = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise VerificationError("payload is not JSON") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise VerificationError(f"payload is not an in-toto Statement v1 ({STATEMENT_TYPE})")
    if (ptype := statement.get("predicateType")) != PREDICATE_TYPE:
        raise VerificationError(f"predicateType is {ptype!r}, expected {PREDICATE_TYPE!r}")
    if not isinstance(statement.get("subject"), list) or not statement["subject"]:
        raise VerificationError("statement has no subjects")
    for subject in statement["subject"]:
        _check_subject(path.parent, subject)
    _check_no_unsigned_files(path.parent, {s["name"] for s in statement["subject"]}, path.name)
    if data_files:
        _check_data(statement.get("predicate"), data_files, data_key)
    return statement
