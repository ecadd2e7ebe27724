"""Ed25519 signing keys as PEM files, and the DSSE key ids that name them.

Key id rules (both are sha256 hex):

* ``securesystemslib`` (what dplora writes; the convention of securesystemslib, TUF and in-toto):
  sha256 of the canonical JSON ``{"keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": <hex>}}``,
  as ``securesystemslib.signer.SSlibKey.from_crypto`` computes it.
* ``raw-key`` (releases made before dplora used securesystemslib): sha256 of the raw 32-byte public key (RFC 8032).
"""

from __future__ import annotations

import enum
import hashlib
import os
import warnings
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from securesystemslib.signer import SSlibKey

from dplora import atomic
from dplora.errors import BadInputError

SIGNING_KEY_ENV = "DPLORA_SIGNING_KEY"  # path to the private key PEM
NO_SIGNING_KEY = "no signing key: pass --signing-key PATH or set DPLORA_SIGNING_KEY; "
NO_SIGNING_KEY += "create one with `dplora keygen`"


class KeyIdRule(str, enum.Enum):
    """Which key id a verified DSSE signature carried."""

    SSLIB = "securesystemslib"  # sha256 of the key's canonical JSON (keytype, scheme, keyval)
    RAW_KEY = "raw-key"  # sha256 of the raw 32-byte key: releases made before securesystemslib
    NONE = "none"  # an empty key id (DSSE makes keyid optional)


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
        BadInputError: If a target exists and ``overwrite`` is False, or a file cannot be written (both files are
            written whole through :mod:`dplora.atomic`; a new private key is removed if its public key fails).
    """
    private_path = Path(private_path)
    public_path = Path(public_path) if public_path is not None else private_path.with_suffix(".pub")
    for p in () if overwrite else (private_path, public_path):
        if p.exists():
            raise BadInputError(f"{p} already exists; pass --overwrite to replace it, or choose another path")
    key = Ed25519PrivateKey.generate()
    priv_pem = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    pub_pem = key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    try:
        for p in (private_path, public_path):
            p.parent.mkdir(parents=True, exist_ok=True)
        # Whole files or none (temp, fsync, rename: dplora.atomic); a symlink at a target is replaced, never
        # followed. The private key is exactly 0600 whatever the umask or an old file's mode.
        atomic.write_bytes(private_path, priv_pem, mode=0o600)
        try:
            atomic.write_bytes(public_path, pub_pem, mode=0o644)
        except (OSError, atomic.DiskFullError):
            if not overwrite:  # no half pair left behind: the private key was new
                private_path.unlink(missing_ok=True)
            raise
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


def signing_key_path(path: Path | None) -> Path | None:
    """The signing key's file: ``path``, else ``$DPLORA_SIGNING_KEY`` (blank counts as unset), else None.

    The one place the environment fallback is read, for the key's loader and for the run's list of inputs its
    output folder must not hold."""
    if path is not None:
        return Path(path)
    env = os.environ.get(SIGNING_KEY_ENV, "").strip()
    return Path(env) if env else None


def load_private_key(path: Path | None) -> Ed25519PrivateKey:
    """Load a PEM Ed25519 (RFC 8032) private key; warns (``UserWarning``) if group/world readable.

    Args:
        path: Unencrypted PEM private key path, or None to use ``$DPLORA_SIGNING_KEY``.
    Returns:
        The private key.
    Raises:
        BadInputError: If no key is given, or the file is unreadable, not PEM, encrypted, or not Ed25519.
    """
    path = signing_key_path(path)
    if path is None:
        raise BadInputError(NO_SIGNING_KEY)
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


def raw_public_bytes(public_key: Ed25519PublicKey) -> bytes:
    """The raw 32-byte Ed25519 (RFC 8032) public key."""
    return public_key.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)


def key_id(public_key: Ed25519PublicKey) -> str:
    """The DSSE ``keyid`` dplora writes: securesystemslib's default key id.

    Args:
        public_key: An Ed25519 public key.
    Returns:
        Lowercase hex sha256 of the canonical JSON of keytype, scheme and value (``SSlibKey.from_crypto``).

    >>> from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    >>> len(key_id(Ed25519PrivateKey.generate().public_key()))
    64
    """
    return SSlibKey.from_crypto(public_key).keyid


def legacy_key_id(public_key: Ed25519PublicKey) -> str:
    """The key id of releases made before securesystemslib: hex sha256 of the raw 32-byte Ed25519 public key."""
    return hashlib.sha256(raw_public_bytes(public_key)).hexdigest()


def sslib_keys(public_key: Ed25519PublicKey) -> list[tuple[KeyIdRule, SSlibKey]]:
    """The public key as securesystemslib ``SSlibKey`` objects, one per accepted key id rule, newest first."""
    value = {"public": raw_public_bytes(public_key).hex()}
    ids = ((KeyIdRule.SSLIB, key_id(public_key)), (KeyIdRule.RAW_KEY, legacy_key_id(public_key)), (KeyIdRule.NONE, ""))
    return [(rule, SSlibKey(kid, "ed25519", "ed25519", value)) for rule, kid in ids]
