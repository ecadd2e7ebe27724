"""File digests: SHA-256 of a file (the data fingerprint, artifact subjects) and the data owner's keyed HMAC-SHA256,
salted for release records (:func:`salted_hmac_sha256_file`: an unsalted keyed digest links releases).

Used by the run's checkpoints (the data file's digest) and by the release (artifact subjects, keyed data digests),
so it sits in the data stage, below both. Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path


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


def hmac_sha256_file(path: Path, key: bytes, salt: bytes = b"") -> str:
    """Hex HMAC-SHA256 (RFC 2104) of ``salt ‖ file bytes``, streamed in 1 MiB chunks.

    Args:
        path: The file to digest.
        key: The data owner's secret key.
        salt: Bytes MACed before the file's (empty: the plain keyed digest of older records).
    Returns:
        The lowercase hex MAC.
    Raises:
        OSError: If the file cannot be read.
    """
    h = hmac.new(key, digestmod=hashlib.sha256)
    h.update(salt)
    return _stream(path, h)


SALT_BYTES = 32


def new_salt() -> bytes:
    """A fresh 32-byte salt from the OS's CSPRNG (``os.urandom``): one per release record, never reused."""
    return os.urandom(SALT_BYTES)
