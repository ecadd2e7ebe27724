"""Signed release records: an in-toto Statement v1 in a DSSE v1 envelope, Ed25519-signed with securesystemslib.

Envelope (``release.dsse.json``): DSSE v1 (https://github.com/secure-systems-lab/dsse/blob/master/protocol.md)
made and checked by securesystemslib (``dsse.Envelope``, ``CryptoSigner``, ``SSlibKey``), so its key id is
securesystemslib's (see :mod:`dplora.release.keys`); older releases signed under the raw-key key id still verify.
Payload: the canonical JSON of an in-toto Statement v1
(https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md) whose subjects are the released
artifact files (path relative to the release folder + sha256). Beside it, ``release.sigstore.json`` holds the
same envelope as a Sigstore bundle v0.3 (https://github.com/sigstore/protobuf-specs, ``Bundle``) whose
verification material is a public-key hint (the key id): no certificate, no transparency-log entry.

Predicate type ``https://dplora.dev/release/v1``: the predicate is the trainer's record dict,
written verbatim (nothing is added); ``dplora audit --attach`` later re-signs it with an ``audit`` section
added (:mod:`dplora.audit.attach`), the artifacts unchanged. Its ``data.digest`` entry, when present, comes from
:func:`data_digest_entry`: an HMAC-SHA256 (RFC 2104) of a fresh random salt and each data file under the data
owner's key, never a plain hash (a plain hash of private data would let anyone confirm a guess of it), and never the
same for two releases of one file (an unsalted HMAC would tell anyone holding two records whether the data
changed between them, e.g. whether a deletion request was honoured, outside any ε).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib.dsse import Envelope
from securesystemslib.signer import CryptoSigner

from dplora import atomic
from dplora.contract.spec import DataSection
from dplora.data.digest import hmac_sha256_file, new_salt, sha256_file
from dplora.errors import BadInputError
from dplora.run.outputs import fix_mtimes

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://dplora.dev/release/v1"
# A non-private control run (privacy.enabled: false, see dplora.mechanism.control) signs under its own predicate
# type, so that no verifier can take it for a DP release; `dplora verify` reports it as NOT DIFFERENTIALLY PRIVATE.
NON_PRIVATE_PREDICATE_TYPE = "https://dplora.dev/non-private/v1"
RELEASE_FILENAME = "release.dsse.json"
SIGSTORE_FILENAME = "release.sigstore.json"
RELEASE_FILES = (RELEASE_FILENAME, SIGSTORE_FILENAME)  # the signed envelope, and the same as a bundle
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
BUNDLE_MEDIA_TYPES = (BUNDLE_MEDIA_TYPE, "application/vnd.dev.sigstore.bundle+json;version=0.3")
MODEL_CARD = "README.md"  # the Hugging Face model card in adapter/
DATA_KEY_ENV = "DPLORA_DATA_KEY"  # path to the data owner's HMAC key file
MIN_DATA_KEY_BYTES = 16


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


def data_key_path(path: Path | None) -> Path | None:
    """The data key's file: ``path``, else ``$DPLORA_DATA_KEY`` (blank counts as unset), else None: the one place
    the environment fallback is read."""
    if path is not None:
        return Path(path)
    env = os.environ.get(DATA_KEY_ENV, "").strip()
    return Path(env) if env else None


def load_data_key(path: Path | None) -> bytes | None:
    """Load the data owner's HMAC (RFC 2104) key from ``path``, else ``$DPLORA_DATA_KEY``, else None.

    Args:
        path: Key file (raw bytes; one trailing newline is stripped), or None to use the environment.
    Returns:
        The key bytes, or None when no key was given.
    Raises:
        BadInputError: If the file cannot be read or holds under 16 bytes (names the path, never the key).
    """
    path = data_key_path(path)
    if path is None:
        return None
    try:
        key = Path(path).read_bytes().removesuffix(b"\n").removesuffix(b"\r")
    except OSError as exc:
        raise BadInputError(f"cannot read data key file {path}: {exc.strerror or exc}") from None
    if len(key) < MIN_DATA_KEY_BYTES:
        raise BadInputError(f"data key in {path} is too short: need at least {MIN_DATA_KEY_BYTES} bytes")
    return key


SALTED_HMAC = "hmac-sha256(salt||data)"  # the record's data.digest.algorithm (older records: unsalted)


def data_digest_entry(data_files: list[Path], key: bytes | None) -> dict:
    """The record's ``data.digest`` entry: HMAC-SHA256(key, salt ‖ data) (RFC 2104) per file by basename, with a
    fresh 32-byte salt from ``os.urandom`` in the entry; or none without a key.

    The salt makes two releases of the same file carry different digests, so the records alone say nothing about
    whether the data changed between them; ``dplora verify --data --data-key`` recomputes the MAC with the
    recorded salt (the record is signed, so the salt cannot be swapped).

    Args:
        data_files: The training data files.
        key: The data owner's HMAC key, or None.
    Returns:
        ``{"algorithm": "hmac-sha256(salt||data)", "keyed": True, "salt": hex, "files": {basename: hex},
        "note"}``, or ``{"algorithm": None, "keyed": False, "files": {}, "note"}`` without a key.
    Raises:
        BadInputError: If two data files share a basename.
        OSError: If a data file cannot be read.
    """
    if key is None:
        note = "no data key was given: the data digest is omitted "
        note += "(a plain hash of private data would let anyone confirm a guess)"
        return {"algorithm": None, "keyed": False, "files": {}, "note": note}
    salt = new_salt()
    files: dict[str, str] = {}
    for p in map(Path, data_files):
        if p.name in files:
            raise BadInputError(f"two data files share the name {p.name}: the data digest is keyed by name")
        files[p.name] = hmac_sha256_file(p, key, salt)
    note = "keyed digest of a fresh random salt and the data; the data owner holds the key"
    return {"algorithm": SALTED_HMAC, "keyed": True, "salt": salt.hex(), "files": files, "note": note}


def predicate_type_of(record: dict) -> str:
    """``NON_PRIVATE_PREDICATE_TYPE`` for a control run's record (``differentially_private: false``), else
    ``PREDICATE_TYPE``."""
    return NON_PRIVATE_PREDICATE_TYPE if record.get("differentially_private") is False else PREDICATE_TYPE


def build_statement(record: dict, subjects: dict[str, str]) -> dict:
    """Build an in-toto Statement v1 with predicate type :func:`predicate_type_of` the record.

    Args:
        record: The run record, used verbatim as the predicate.
        subjects: ``{relative name: sha256 hex}`` of the released artifacts.
    Returns:
        The statement dict, subjects sorted by name.
    """
    subject = [{"name": n, "digest": {"sha256": subjects[n]}} for n in sorted(subjects)]
    ptype = predicate_type_of(record)
    return {"_type": STATEMENT_TYPE, "subject": subject, "predicateType": ptype, "predicate": record}


def sign_statement(statement: dict, private_key: Ed25519PrivateKey) -> dict:
    """Sign a statement into a DSSE v1 envelope with securesystemslib (Ed25519, RFC 8032, over the DSSE PAE).

    Args:
        statement: The in-toto Statement v1 dict.
        private_key: The Ed25519 signing key.
    Returns:
        ``{"payload" (base64 canonical JSON), "payloadType", "signatures": [{"keyid", "sig" (base64)}]}``;
        the key id is securesystemslib's (:func:`dplora.release.keys.key_id`).
    Raises:
        BadInputError: If the statement is not canonical-JSON serializable.
    """
    envelope = Envelope(canonical_json(statement), PAYLOAD_TYPE, {})
    envelope.sign(CryptoSigner(private_key))
    return envelope.to_dict()


def sigstore_bundle(envelope: dict) -> dict:
    """The envelope as a Sigstore bundle v0.3: DSSE envelope plus a public-key hint, nothing else.

    Args:
        envelope: A signed DSSE envelope dict (:func:`sign_statement`).
    Returns:
        ``{"mediaType", "verificationMaterial": {"publicKey": {"hint": keyid}, "tlogEntries": []},
        "dsseEnvelope"}``: key-based, so no certificate and no transparency-log entry.
    """
    hint = envelope["signatures"][0]["keyid"]
    material = {"publicKey": {"hint": hint}, "tlogEntries": []}
    return {"mediaType": BUNDLE_MEDIA_TYPE, "verificationMaterial": material, "dsseEnvelope": envelope}


def write_temp(folder: Path, name: str, data: bytes) -> Path:
    """Write ``data`` to a new fsynced temp file ``folder/.name.*.tmp`` (mode 0644) and return its path.

    The caller renames it over the real file (``os.replace``), so readers see the old or the new bytes, never a
    mix. Raises: DiskFullError naming the file (ENOSPC/EDQUOT), OSError (the temp file is removed first).
    Source: :func:`dplora.atomic.write_temp`.
    """
    return atomic.write_temp(folder, name, data)


def temp_json(folder: Path, name: str, obj) -> Path:
    """Write ``obj`` as indented, key-sorted JSON (UTF-8, one trailing newline) to a temp file (:func:`write_temp`).

    Returns the temp file's path, for the caller to rename over ``folder/name``. Raises: as :func:`write_temp`.
    """
    return write_temp(folder, name, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def write_release(*, output_dir: Path, record: dict, artifact_files: list[Path], private_key) -> Path:
    """Sign ``record`` + artifact sha256s as ``release.dsse.json`` and its bundle ``release.sigstore.json``.

    Both are written to temp files in the same folder (fsync), then renamed so that every state in between
    verifies: an old bundle is removed first, the envelope renamed next, the bundle last (a release without its
    bundle verifies; a bundle around another envelope does not). On any error the files that were there before
    are put back byte for byte (a re-signed record, e.g. ``dplora audit --attach``, leaves the old one valid), and
    a first release leaves neither file behind.

    Args:
        output_dir: The run's output folder; subject names are POSIX paths relative to it.
        record: The predicate, written verbatim.
        artifact_files: Files to list as subjects; each must be a file inside ``output_dir``.
        private_key: The Ed25519 signing key.
    Returns:
        The path of the written envelope.
    Every file and folder under ``output_dir`` then gets the record's ``started_at`` as its mtime (taken before
    the data was read): a re-signed record (``audit --attach``, a sweep's release) must not carry the time it was
    signed, which times the private run.

    Raises:
        BadInputError: If no artifact is given, one is missing or outside ``output_dir``, or bad JSON.
        OSError: If a file cannot be written (the previous files, if any, are restored).
    """
    root = Path(output_dir).resolve()
    subjects: dict[str, str] = {}
    for a in map(Path, artifact_files):
        p = (a if a.is_absolute() else root / a).resolve()
        if not p.is_relative_to(root) or p == root or p.relative_to(root).as_posix() in RELEASE_FILES:
            raise BadInputError(f"artifact {a} is not a file inside the output folder {output_dir}")
        if not p.is_file():
            raise BadInputError(f"artifact {a} is missing or not a file")
        subjects[p.relative_to(root).as_posix()] = sha256_file(p)
    if not subjects:
        raise BadInputError("a release needs at least one artifact file")
    envelope = sign_statement(build_statement(record, subjects), private_key)
    targets = (root / RELEASE_FILENAME, root / SIGSTORE_FILENAME)
    previous = {t: t.read_bytes() for t in targets if t.is_file()}
    temps: list[tuple[Path, Path]] = []
    try:
        for name, doc in ((RELEASE_FILENAME, envelope), (SIGSTORE_FILENAME, sigstore_bundle(envelope))):
            temps.append((temp_json(root, name, doc), root / name))
        targets[1].unlink(missing_ok=True)  # old envelope, no bundle: still a valid (old) release
        for tmp, target in temps:
            os.replace(tmp, target)
        atomic.fsync_dir(root)
        if record.get("started_at"):  # every released file carries the record's start, never the signing time
            fix_mtimes(root, record["started_at"])
    except BaseException:
        for tmp, target in temps:
            tmp.unlink(missing_ok=True)
            if target in previous:
                _restore(target, previous[target])
            else:
                target.unlink(missing_ok=True)  # no half release: neither file, rather than one of them
        raise
    return root / RELEASE_FILENAME


def _restore(path: Path, data: bytes) -> None:
    """Put ``data`` back at ``path`` atomically (temp file + rename), best effort while handling an error."""
    tmp = None
    try:
        tmp = write_temp(path.parent, path.name, data)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def finish_adapter_dir(adapter_dir: Path, data: DataSection, record: dict) -> list[Path]:
    """Make a saved peft adapter folder loadable elsewhere and self-describing, before it is signed.

    Sets ``adapter_config.json``'s ``base_model_name_or_path`` to the record's loadable base-model name
    (never a local path) and replaces peft's generated card with dplora's model card (:mod:`dplora.release.card`).
    A non-private control's config also gets ``dplora_privacy``: its no-DP statement (peft ignores the key).

    Args:
        adapter_dir: The folder ``save_pretrained`` wrote (adapter_config.json, adapter weights).
        data: The contract's data section (:class:`dplora.contract.spec.DataSection`), for the model card.
        record: The release record with its ``base_model`` entry (:func:`dplora.release.record.build_record`).
    Returns:
        Every file in ``adapter_dir``, sorted: the artifacts to sign.
    Raises:
        BadInputError: If ``adapter_config.json`` is missing or not JSON.
    """
    from dplora.release.card import model_card

    adapter_dir = Path(adapter_dir)
    config_path = adapter_dir / "adapter_config.json"
    try:
        adapter_config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadInputError(f"cannot read {config_path.name} in the adapter folder: {exc}") from None
    adapter_config["base_model_name_or_path"] = record["base_model"]["name_or_path"]
    if predicate_type_of(record) == NON_PRIVATE_PREDICATE_TYPE:
        adapter_config["dplora_privacy"] = record["statement"]
    atomic.write_json(config_path, adapter_config)
    atomic.write_text(adapter_dir / MODEL_CARD, model_card(record, data))
    return sorted(p for p in adapter_dir.rglob("*") if p.is_file())


def finish_release(output_dir: Path, data: DataSection, record: dict, *, private_key) -> Path:
    """Finish ``output_dir/adapter`` (:func:`finish_adapter_dir`) and sign it with ``contract.yaml``.

    Args:
        output_dir: The run folder holding ``adapter/`` and ``contract.yaml``.
        data: The contract's data section, for the model card.
        record: The release record without ``artifacts``; they are added here (relative POSIX names).
        private_key: The Ed25519 signing key.
    Returns:
        The path of the written envelope (:func:`write_release`).
    Raises:
        BadInputError: See :func:`finish_adapter_dir` and :func:`write_release`.
    """
    root = Path(output_dir).resolve()
    artifacts = finish_adapter_dir(root / "adapter", data, record) + [root / "contract.yaml"]
    record = {**record, "artifacts": sorted(p.relative_to(root).as_posix() for p in artifacts)}
    return write_release(output_dir=root, record=record, artifact_files=artifacts, private_key=private_key)
