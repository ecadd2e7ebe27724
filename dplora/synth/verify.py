"""Checking a synthetic file (``dplora synth``) against its signed manifest and the release it came from.

The manifest is a DSSE envelope over an in-toto Statement v1 (see :mod:`dplora.synth.files`), opened with the same
rules as a release (:func:`dplora.release.statement.open_statement`: securesystemslib key id, then the older raw-key
rule, then an empty key id). The chain is: synthetic file --sha256--> manifest subject; manifest
``source_release.record_digest`` --sha256--> the release's DSSE payload; release --signature, digests--> its files.
"""

from __future__ import annotations

import dataclasses
import hmac
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from dplora.data.digest import sha256_file
from dplora.errors import BadInputError, VerificationError
from dplora.release.derived import check_same_privacy, check_source_release
from dplora.release.keys import load_public_key
from dplora.release.statement import open_statement, sha256_mismatch
from dplora.release.verify import VerifiedRelease, verify_release
from dplora.synth.files import (
    NON_PRIVATE_SYNTH_PREDICATE_TYPE,
    SYNTH_PREDICATE_TYPE,
    SYNTH_PREDICATE_TYPES,
    manifest_path,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedSynthetic:
    """What :func:`verify_synthetic` checked: the manifest's statement, its path, and the release it chains to."""

    statement: dict
    manifest: Path
    release: VerifiedRelease

    @property
    def differentially_private(self) -> bool:
        """False when the manifest is a non-private control's (its release is then one too: checked)."""
        return self.statement.get("predicateType") == SYNTH_PREDICATE_TYPE and self.release.differentially_private


def verify_synthetic(
    synthetic: Path,
    release_path: Path,
    public_key,
    *,
    manifest: Path | None = None,
    release: VerifiedRelease | None = None,
) -> VerifiedSynthetic:
    """Verify a synthetic file against its signed manifest (``FILE.dsse.json``) and the release it came from.

    Checks, in order: the release (:func:`dplora.release.verify.verify_release`, unless ``release`` is the result of
    that
    call already made); the manifest's DSSE signature by ``public_key`` (the release's key rules); an in-toto
    Statement v1 with a synthetic predicate type; exactly one subject, named like the file, whose sha256 equals the
    file's (one changed byte fails); ``source_release.record_digest`` equals the sha256 of this release's DSSE
    payload; the manifest's privacy (predicate type and ``differentially_private``) equals the release's.

    Args:
        synthetic: the csv/jsonl file written by ``dplora synth``.
        release_path: the run folder or its ``release.dsse.json``.
        public_key: an Ed25519 public key or the path of its PEM file.
        manifest: the manifest; default ``synthetic`` + ``.dsse.json``.
        release: an already verified release (skips a second :func:`verify_release`).

    Returns:
        :class:`VerifiedSynthetic`.

    Raises:
        BadInputError: an unreadable file, manifest or key (exit 2).
        VerificationError: the first mismatch, in one line (exit 3).
    """
    synthetic = Path(synthetic)
    if not isinstance(public_key, Ed25519PublicKey):
        public_key = load_public_key(Path(public_key))
    if release is None:
        release = verify_release(release_path, public_key)
    man = Path(manifest) if manifest is not None else manifest_path(synthetic)
    if not man.is_file():
        raise BadInputError(f"no manifest {man} for the synthetic file (pass --manifest PATH)")
    if not synthetic.is_file():
        raise BadInputError(f"synthetic file {synthetic} does not exist")
    statement = open_statement(man, public_key, SYNTH_PREDICATE_TYPES, what="manifest").statement
    subjects = statement.get("subject")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        raise VerificationError("manifest must name exactly one synthetic file")
    if subjects[0].get("name") != synthetic.name:
        raise VerificationError(f"manifest covers {subjects[0].get('name')!r}, not {synthetic.name!r}")
    expected = str((subjects[0].get("digest") or {}).get("sha256", "")).lower()
    if not hmac.compare_digest(found := sha256_file(synthetic), expected):
        raise VerificationError(f"{synthetic.name}: {sha256_mismatch(expected, found)}")
    predicate = statement.get("predicate") if isinstance(statement.get("predicate"), dict) else {}
    check_source_release(predicate, release_path, what="manifest")
    manifest_private = (
        statement["predicateType"] == SYNTH_PREDICATE_TYPE and predicate.get("differentially_private") is True
    )
    check_same_privacy(
        manifest_private,
        release.differentially_private,
        non_private_type=NON_PRIVATE_SYNTH_PREDICATE_TYPE,
        what="synthetic manifest",
    )
    return VerifiedSynthetic(statement=statement, manifest=man, release=release)
