"""Checking a release as a reviewer would: the signature, every file, and optionally the data and the base model.

The DSSE envelope and its in-toto statement are opened by :func:`dplora.release.statement.open_statement`
(securesystemslib's key id rule, then the older raw-key rule, then an empty key id); :class:`VerifiedRelease` says
which matched. See :mod:`dplora.release.envelope` for the format.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import re
from pathlib import Path, PurePosixPath

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from dplora.data.digest import hmac_sha256_file, sha256_file
from dplora.errors import BadInputError, VerificationError
from dplora.release.audit_section import (
    composed_attack_ceiling,
    composed_runs,
    first_mismatch,
    record_mechanism,
    same_value,
    tuning_attack_ceiling,
    tuning_runs,
)
from dplora.release.envelope import (
    BUNDLE_MEDIA_TYPES,
    NON_PRIVATE_PREDICATE_TYPE,
    PREDICATE_TYPE,
    RELEASE_FILENAME,
    SALTED_HMAC,
    SIGSTORE_FILENAME,
)
from dplora.release.keys import KeyIdRule, load_public_key
from dplora.release.statement import open_statement, sha256_mismatch, short_digest


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedRelease:
    """What :func:`verify_release` checked: the statement, which key id rule matched, bundle and base model."""

    statement: dict
    key_id_rule: KeyIdRule
    bundle: bool  # release.sigstore.json was present and holds the same envelope
    base_model_files: tuple[str, ...] = ()  # base-model files whose sha256 matched (empty: not checked)
    attack_ceiling: dict | None = None  # recomputed from the record's mechanism (None: a non-private record)
    ceiling_recorded: bool = False  # the record holds an attack_ceiling entry (older records do not)

    @property
    def audit(self) -> dict | None:
        """The record's attached ``audit`` section (``dplora audit --attach``), or None."""
        predicate = self.statement.get("predicate")
        return predicate.get("audit") if isinstance(predicate, dict) else None

    @property
    def differentially_private(self) -> bool:
        """False for a non-private control run's record (predicate type ``NON_PRIVATE_PREDICATE_TYPE``)."""
        return self.statement.get("predicateType") == PREDICATE_TYPE


def _check_bundle(folder: Path, env: dict) -> bool:
    """False without ``release.sigstore.json``; True if it is a v0.3 bundle around the very same envelope."""
    path = folder / SIGSTORE_FILENAME
    if not path.exists():
        return False
    try:
        bundle = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise VerificationError(f"{SIGSTORE_FILENAME} is not readable JSON") from None
    if not isinstance(bundle, dict) or bundle.get("mediaType") not in BUNDLE_MEDIA_TYPES:
        raise VerificationError(f"{SIGSTORE_FILENAME} is not a Sigstore bundle v0.3")
    if bundle.get("dsseEnvelope") != env:
        raise VerificationError(f"{SIGSTORE_FILENAME} does not hold the envelope of {RELEASE_FILENAME}")
    return True


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
        raise VerificationError(f"{name}: {sha256_mismatch(digest, found)}")


def _salt(digest: dict) -> bytes:
    """The recorded salt (64 hex digits) of a salted digest; b"" for an unsalted one (older records).

    Raises:
        VerificationError: a salted digest without a well-formed salt, or a salt in an unsalted one.
    """
    salted = digest.get("algorithm") == SALTED_HMAC
    salt = digest.get("salt")
    if not salted and salt is None:
        return b""
    if not salted or not isinstance(salt, str) or not re.fullmatch(r"[0-9a-f]{64}", salt):
        raise VerificationError("the release's keyed data digest has a malformed salt (64 hex digits expected)")
    return bytes.fromhex(salt)


def _check_data(predicate, data_files: list[Path], data_key: bytes) -> None:
    for p in map(Path, data_files):
        check_data_file(predicate, p, data_key)


def check_data_file(predicate, path: Path, data_key: bytes, *, name: str | None = None) -> None:
    """Check one data file against the record's keyed ``data.digest``
    (:func:`dplora.release.envelope.data_digest_entry`): HMAC-SHA256 (RFC 2104) of the recorded salt and the file.

    Args:
        predicate: the release record (its ``data.digest``).
        path: the data file.
        data_key: the data owner's HMAC key.
        name: the recorded file name to check against (default: ``path``'s own name; a file moved under another
            name is checked against the name it was trained under).
    Raises:
        VerificationError: no keyed digest in the record, the name is not in it, a malformed salt, or a mismatch
            (exit 3); the message names the file, never its content.
        BadInputError: the file cannot be read (exit 2).
    """
    data = predicate.get("data") if isinstance(predicate, dict) else None
    digest = data.get("digest") if isinstance(data, dict) else None
    files = digest.get("files") if isinstance(digest, dict) and digest.get("keyed") is True else None
    if not isinstance(files, dict):
        raise VerificationError("the release has no keyed data digest to check the data files against")
    salt = _salt(digest)
    path = Path(path)
    name = path.name if name is None else name
    if name not in files:
        raise VerificationError(f"{name}: not in the release's data digest")
    try:
        found = hmac_sha256_file(path, data_key, salt)
    except OSError as exc:
        raise BadInputError(f"cannot read data file {path}: {exc.strerror or exc}") from None
    if not hmac.compare_digest(found, str(files[name]).lower()):
        raise VerificationError(f"{path.name}: data HMAC mismatch (wrong data file or wrong data key)")


def check_base_model(predicate, path: Path) -> tuple[str, ...]:
    """Names of the recorded base-model files that ``path`` (a folder, or one file such as a .gguf) matches.

    Args:
        predicate: the release record (its ``base_model.files``: ``{file name: sha256 hex}``, and ``package``).
        path: a base-model folder (every recorded file must match its sha256, FIPS 180-4) or one file (it must
            match one recorded file, or the packaged ``.gguf``).
    Returns:
        The matched file names, sorted for a folder.
    Raises:
        VerificationError: no recorded digests, a missing file or a sha256 mismatch (exit 3).
        BadInputError: ``path`` is neither a file nor a folder (exit 2).
    """
    base = predicate.get("base_model") if isinstance(predicate, dict) else None
    files = base.get("files") if isinstance(base, dict) else None
    if not isinstance(files, dict) or not files:
        raise VerificationError("the release records no base-model digests (an older release)")
    package = base.get("package") if isinstance(base.get("package"), dict) else {}
    hint = f" (trained on the de-quantized {package['file']}: pass that file)" if package.get("file") else ""
    if path.is_file():
        found = sha256_file(path)
        known = {**files, **({package["file"]: package.get("sha256")} if package.get("file") else {})}
        matched = tuple(n for n, d in known.items() if isinstance(d, str) and hmac.compare_digest(found, d.lower()))
        if not matched:
            raise VerificationError(f"base model: {path.name} (sha256 {short_digest(found)}) matches no recorded file")
        return matched
    if not path.is_dir():
        raise BadInputError(f"--base-model {path}: no such file or folder")
    for name, digest in sorted(files.items()):
        if PurePosixPath(name).name != name or not isinstance(digest, str):
            raise VerificationError(f"malformed base-model file entry {name!r} in the record")
        if not (path / name).is_file():
            raise VerificationError(f"base model: {name} is missing in {path}{hint}")
        if not hmac.compare_digest(found := sha256_file(path / name), digest.lower()):
            raise VerificationError(f"base model: {name}: {sha256_mismatch(digest, found)}{hint}")
    return tuple(sorted(files))


# A release written before the private folder existed held its per-step log here; accepted, with a warning.
UNSIGNED_BY_DESIGN = ("metrics.jsonl",)


def shipping_note(folder: Path) -> str:
    """What to ship: this folder only, never ``<folder>.private``; warns about a legacy ``metrics.jsonl`` inside.

    Args:
        folder: the release folder (holding ``release.dsse.json``).
    Returns:
        One line for ``dplora verify`` (starts with ``warning:`` when the folder holds private numbers).
    """
    private = f"{folder.name}.private"
    legacy = [name for name in UNSIGNED_BY_DESIGN if (folder / name).is_file()]
    if legacy:
        return (
            f"warning: {', '.join(legacy)} in the release folder holds per-step losses, realised batch sizes and "
            f"step times computed on private data (not covered by DP; written by an older dplora): delete it "
            f"before shipping; never ship {private}/ either"
        )
    return f"ship this folder only; never ship {private}/ beside it (private numbers, not covered by DP)"


def _check_no_unsigned_files(folder: Path, signed: set[str], envelope_name: str) -> None:
    """Refuse files the signature does not cover (an extra file in adapter/ would be loaded by peft)."""
    allowed = signed | {envelope_name, SIGSTORE_FILENAME, *UNSIGNED_BY_DESIGN}
    for p in sorted(folder.rglob("*")):
        name = p.relative_to(folder).as_posix()
        if p.is_file() and name not in allowed:
            raise VerificationError(f"{name}: file is not covered by the signature (remove it or re-release)")


def _check_audit(predicate) -> None:
    """An attached audit section must describe an audit of this record's mechanism (signed or not, it must agree)."""
    section = predicate.get("audit") if isinstance(predicate, dict) else None
    if section is None:
        return
    if not isinstance(section, dict) or not isinstance(section.get("mechanism"), dict):
        raise VerificationError("the audit section is malformed (no mechanism)")
    if (what := first_mismatch(section["mechanism"], record_mechanism(predicate))) is not None:
        raise VerificationError(f"the audit section is not an audit of this record's mechanism ({what})")
    claimed, spent = section.get("claimed_epsilon"), (predicate.get("accounting") or {}).get("epsilon_spent")
    if not same_value(claimed, spent):
        raise VerificationError(f"the audit's claimed ε={claimed!r} is not the record's ε={spent!r}")


def check_attack_ceiling(predicate) -> tuple[dict | None, bool]:
    """(the attack ceiling recomputed from the record's mechanism, whether the record states one).

    (None, False) for a predicate with neither a mechanism nor a ceiling entry.

    The ceiling is recomputed (never read, never cached) from the public q, σ, T and adjacency of the record's
    ``mechanism`` entry (:func:`dplora.accounting.ceiling.ceiling_entry`); a recorded ceiling that differs by more
    than 1e-4 in any TPR fails. For a ``dplora sweep`` release the ceiling returned is every trial's composed
    (:func:`_with_tuning`); with an attached audit on the private data it is the runs' and the audit's together
    (:func:`_with_attached_audit`): the record publishes all their outputs.

    Raises:
        VerificationError: the mechanism entry is malformed, or a recorded ceiling differs.
    """
    from dplora.accounting.ceiling import ceiling_entry, same_ceiling
    from dplora.accounting.events import DpSgdEvent

    mech = predicate.get("mechanism") if isinstance(predicate, dict) else None
    if mech is None and predicate.get("attack_ceiling") is None:
        return None, False  # not a dplora training record (no mechanism to state a ceiling of)
    try:
        event = DpSgdEvent.from_dict(mech)
    except (KeyError, TypeError, ValueError):
        raise VerificationError("the record's mechanism entry is malformed (q, σ, T, adjacency)") from None
    recomputed = ceiling_entry(event, use_cache=False)
    recorded = predicate.get("attack_ceiling")
    if recorded is None:
        return _with_attached_audit(predicate, _with_tuning(predicate, recomputed)), False
    if not isinstance(recorded, dict):
        raise VerificationError("the record's attack_ceiling entry is malformed")
    if (what := same_ceiling(recorded, recomputed)) is not None:
        raise VerificationError(f"the record's attack ceiling is not its mechanism's ({what})")
    return _with_attached_audit(predicate, _with_tuning(predicate, recomputed)), True


def _with_tuning(predicate: dict, release: dict) -> dict:
    """The ceiling of a ``dplora sweep`` release: every trial's q, σ, T composed, recomputed from ``tuning.per_trial``
    (:func:`dplora.release.audit_section.tuning_attack_ceiling`), since the signed choice is a function of every
    trial; ``release`` for a record without a ``tuning`` entry. A recorded ``tuning.attack_ceiling`` must equal it
    (a record written before it was stated has none: the recomputed one is shown all the same).

    Raises:
        VerificationError: the trials are malformed, or the recorded sweep ceiling differs.
    """
    from dplora.accounting.ceiling import same_ceiling

    tuning = predicate.get("tuning")
    if tuning is None:
        return release
    try:
        trials = tuning_runs(predicate)
        recomputed = tuning_attack_ceiling(trials, predicate["privacy"]["adjacency"], covered=tuning["covered"] is True)
    except (KeyError, TypeError, ValueError):
        raise VerificationError("the tuning entry's trials are malformed (q, σ, T, adjacency)") from None
    recorded = tuning.get("attack_ceiling")
    if recorded is not None:
        if not isinstance(recorded, dict):
            raise VerificationError("the tuning entry's attack_ceiling is malformed")
        if (what := same_ceiling(recorded, recomputed)) is not None:
            raise VerificationError(f"the record's sweep attack ceiling is not its trials' composed ({what})")
    return recomputed


def _with_attached_audit(predicate: dict, release: dict) -> dict:
    """The ceiling the record as a whole allows: the release's, or, with an attached audit on the private data, the
    two runs' together, recomputed from their public q, σ, T and adjacency
    (:func:`dplora.release.audit_section.composed_attack_ceiling`); a recorded composed ceiling must equal it.

    Raises:
        VerificationError: the audit's runs are malformed, or the recorded composed ceiling differs.
    """
    from dplora.accounting.ceiling import same_ceiling

    section = predicate.get("audit")
    if not isinstance(section, dict):
        return release
    try:
        runs = composed_runs(predicate, section)
        if runs is None:
            return release
        recomputed = composed_attack_ceiling(runs, predicate["privacy"]["adjacency"])
    except (KeyError, TypeError, ValueError):
        raise VerificationError("the audit section's runs are malformed (q, σ, T, adjacency)") from None
    recorded = (section.get("composed") or {}).get("attack_ceiling")
    if recorded is not None:
        if not isinstance(recorded, dict):
            raise VerificationError("the audit's composed attack_ceiling entry is malformed")
        if (what := same_ceiling(recorded, recomputed)) is not None:
            raise VerificationError(f"the record's composed attack ceiling is not its two runs' ({what})")
    return recomputed


def verify_release(
    release_path: Path,
    public_key,
    *,
    data_files: list[Path] | None = None,
    data_key: bytes | None = None,
    base_model: Path | None = None,
) -> VerifiedRelease:
    """Verify a release: DSSE v1 envelope, Ed25519 (RFC 8032) signature, in-toto Statement v1, files.

    Checks, in order: envelope and payloadType; a signature by ``public_key`` over the DSSE PAE, through
    securesystemslib's ``Envelope.verify``, under its key id rule, else the older raw-key rule, else an
    empty key id; the statement and predicate type; each subject file's sha256 (names must stay inside the
    folder); no file the signature does not cover; ``release.sigstore.json``, when present, holds the same
    envelope; with ``data_files`` and ``data_key``, each data file's HMAC-SHA256 (RFC 2104) by basename; with
    ``base_model``, the sha256 of every recorded base-model file in that folder (or of that one file). An
    ``audit`` section (``dplora audit --attach``) is covered by the signature like the rest of the record and
    must name this record's mechanism and ε. A private record's attack ceiling is recomputed from its mechanism
    (:func:`check_attack_ceiling`) and must equal the recorded one.

    Args:
        release_path: The envelope file, or the folder holding ``release.dsse.json``.
        public_key: An Ed25519 public key, or a path to a PEM public key.
        data_files: Data files to check against the record's keyed ``data.digest``.
        data_key: The data owner's HMAC key; required with ``data_files``.
        base_model: A base-model folder or file to check against the record's ``base_model.files``.
    Returns:
        :class:`VerifiedRelease`; for a non-private control run's record (``NON_PRIVATE_PREDICATE_TYPE``) its
        ``differentially_private`` is False and the caller must say so.
    Raises:
        BadInputError: If the release file, key or base model cannot be read, or ``data_files`` come without a key.
        VerificationError: On the first mismatch, with a one-line reason naming it.
    """
    path = Path(release_path)
    path = path / RELEASE_FILENAME if path.is_dir() else path
    if not isinstance(public_key, Ed25519PublicKey):
        public_key = load_public_key(Path(public_key))
    if data_files and data_key is None:
        raise BadInputError("data files were given without a data key: pass --data-key or set DPLORA_DATA_KEY")
    opened = open_statement(path, public_key, (PREDICATE_TYPE, NON_PRIVATE_PREDICATE_TYPE))
    statement, env, ptype = opened.statement, opened.envelope, opened.statement["predicateType"]
    if not isinstance(statement.get("subject"), list) or not statement["subject"]:
        raise VerificationError("statement has no subjects")
    for subject in statement["subject"]:
        _check_subject(path.parent, subject)
    _check_no_unsigned_files(path.parent, {s["name"] for s in statement["subject"]}, path.name)
    bundle = _check_bundle(path.parent, env)
    _check_audit(statement.get("predicate"))
    if data_files:
        _check_data(statement.get("predicate"), data_files, data_key)
    matched = check_base_model(statement.get("predicate"), Path(base_model)) if base_model is not None else ()
    ceiling, recorded = (None, False)
    if ptype == PREDICATE_TYPE and isinstance(statement.get("predicate"), dict):
        ceiling, recorded = check_attack_ceiling(statement.get("predicate"))
    return VerifiedRelease(
        statement=statement,
        key_id_rule=opened.key_id_rule,
        bundle=bundle,
        base_model_files=matched,
        attack_ceiling=ceiling,
        ceiling_recorded=recorded,
    )
