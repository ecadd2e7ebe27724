"""File digests: SHA-256 of a file (the data fingerprint, artifact subjects) and the data owner's keyed HMAC-SHA256.

Used by the run's checkpoints (the data file's digest) and by the release (artifact subjects, keyed data digests),
so it sits in the data stage, below both. Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
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
