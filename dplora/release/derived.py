"""What an artifact derived from a release (``dplora synth``, ``dplora export``) says about that release.

A derived artifact is post-processing of the released adapters, so it carries the release's (ε, δ) at its protected
unit and no more (Dwork & Roth 2014, Proposition 2.1). Its signed manifest names the release by its record digest,
the sha256 (FIPS 180-4) of the release's DSSE payload, in a ``source_release`` block (:func:`source_release_entry`);
a verifier checks that digest (:func:`check_source_release`) and that the manifest's privacy is the release's
(:func:`check_same_privacy`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from pathlib import Path

from dplora.errors import BadInputError, VerificationError
from dplora.release.envelope import RELEASE_FILENAME
from dplora.release.statement import read_envelope, short_digest

NO_DP_GUARANTEE = "NO DP GUARANTEE"


def release_payload(release_file: Path) -> tuple[bytes, dict]:
    """(payload bytes, statement) of a release envelope, read without checking the signature.

    Args:
        release_file: the release's ``release.dsse.json``.
    Returns:
        The DSSE payload (the signed statement bytes) and the statement it decodes to.
    Raises:
        BadInputError: unreadable envelope or payload, or a statement without a predicate (exit 2).
    """
    try:
        envelope = json.loads(Path(release_file).read_text(encoding="utf-8"))
        payload = base64.b64decode(envelope["payload"], validate=True)
        statement = json.loads(payload)
    except (OSError, ValueError, KeyError, TypeError, binascii.Error):
        raise BadInputError(f"cannot read the release {release_file}: not a DSSE envelope") from None
    if not isinstance(statement, dict) or not isinstance(statement.get("predicate"), dict):
        raise BadInputError(f"the release {release_file} holds no predicate")
    return payload, statement


def record_digest(payload: bytes) -> str:
    """The release's record digest: hex sha256 (FIPS 180-4) of its DSSE payload (the signed statement bytes)."""
    return hashlib.sha256(payload).hexdigest()


def release_record_digest(release_path: Path) -> str:
    """Hex sha256 (FIPS 180-4) of the release's DSSE payload: the digest a derived artifact's manifest names.

    Args:
        release_path: the run folder or its ``release.dsse.json``.
    Raises:
        BadInputError: no readable envelope at ``release_path``, or no base64 payload in it (exit 2).
        VerificationError: the envelope is not JSON or not an in-toto envelope (exit 3).
    """
    release_path = Path(release_path)
    path = release_path / RELEASE_FILENAME if release_path.is_dir() else release_path
    env = read_envelope(path)
    try:
        return record_digest(base64.b64decode(env["payload"], validate=True))
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise BadInputError(f"{release_path}: the release envelope has no base64 payload") from None


def source_release_entry(payload: bytes, statement: dict, run_name: str) -> dict:
    """The ``source_release`` block of a derived artifact's predicate.

    Args:
        payload: the release's DSSE payload (:func:`release_payload`).
        statement: the statement it decodes to.
        run_name: the run folder's name (a name, never a path).
    Returns:
        ``{"record_digest": {"sha256": hex}, "predicate_type": the release's, "run": run_name}``.
    """
    return {
        "record_digest": {"sha256": record_digest(payload)},
        "predicate_type": statement.get("predicateType"),
        "run": run_name,
    }


def guarantee_text(predicate: dict, *, private: bool, what: str = "synthetic file") -> str:
    """The inherited guarantee in words, from the release's predicate (``privacy`` and ``accounting``).

    Args:
        predicate: the release record (``accounting.epsilon_spent``, ``accounting.delta``, ``accounting.accountant``,
            ``privacy.protected_unit``, ``privacy.adjacency``).
        private: False for a non-private control's release (the text then starts with :data:`NO_DP_GUARANTEE`).
        what: the derived artifact (``synthetic file``; ``exported model`` for ``dplora export``).
    Returns:
        One sentence.
    """
    if not private:
        made = "generated" if what == "synthetic file" else "made"
        return (
            f"{NO_DP_GUARANTEE}: {made} from a non-private control run (privacy.enabled=false, ε = ∞); "
            f"this {what} may reveal the training records"
        )
    acc, unit = predicate.get("accounting", {}), predicate.get("privacy", {})
    return (
        f"post-processing of a release with ε={acc.get('epsilon_spent'):.4g}, δ={acc.get('delta'):g} "
        f"({acc.get('accountant')}) at the protected unit {unit.get('protected_unit')} "
        f"({unit.get('adjacency')}); the {what} carries the same guarantee and no more"
    )


def check_source_release(predicate: dict, release_path: Path, *, what: str) -> None:
    """The manifest's ``source_release.record_digest`` must be the sha256 of this release's DSSE payload.

    Args:
        predicate: the manifest's predicate.
        release_path: the run folder or its ``release.dsse.json``.
        what: the manifest in the message (``"manifest"``, ``"export"``).
    Raises:
        VerificationError: another release's digest, or none (exit 3).
        BadInputError: see :func:`release_record_digest`.
    """
    source = predicate.get("source_release") if isinstance(predicate.get("source_release"), dict) else {}
    recorded = str((source.get("record_digest") or {}).get("sha256", "")).lower()
    actual = release_record_digest(release_path)
    if not hmac.compare_digest(recorded, actual):
        raise VerificationError(
            f"the {what} names release record {short_digest(recorded)}, but this release's is {short_digest(actual)}"
        )


def check_same_privacy(private: bool, release_private: bool, *, non_private_type: str, what: str) -> None:
    """A derived artifact's privacy (its predicate type and ``differentially_private``) must be its release's.

    Args:
        private: the manifest says DP.
        release_private: the release is DP (:attr:`dplora.release.verify.VerifiedRelease.differentially_private`).
        non_private_type: the manifest's non-private predicate type, named in the message.
        what: the manifest in the message (``"synthetic manifest"``, ``"export manifest"``).
    Raises:
        VerificationError: a DP manifest over a control's release, or the other way round (exit 3).
    """
    if private != release_private:
        said = "DP" if private else f"non-private ({non_private_type})"
        whose = "DP" if release_private else "non-private control"
        raise VerificationError(f"a {said} {what} over a {whose} release")
