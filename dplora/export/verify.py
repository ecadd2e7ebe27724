"""Checking an export (``dplora export``) against its signed manifest, the release it came from and the base model.

The manifest ``DIR/dplora-export.dsse.json`` is opened with the release's rules
(:func:`dplora.release.statement.open_statement`). The chain: every file in ``DIR`` --sha256--> a manifest subject (no
unsigned file); manifest ``source_release.record_digest`` --sha256--> the release's DSSE payload; release
--signature, digests--> its files. Given the base model, the merge is redone (peft ``merge_and_unload``) and every
tensor compared with the exported ones.
"""

from __future__ import annotations

import dataclasses
import hmac
from pathlib import Path, PurePosixPath

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from dplora.data.digest import sha256_file
from dplora.errors import BadInputError, VerificationError
from dplora.export.files import (
    EXPORT_PREDICATE_TYPE,
    EXPORT_PREDICATE_TYPES,
    MANIFEST_NAME,
    NON_PRIVATE_EXPORT_PREDICATE_TYPE,
    merged_model,
)
from dplora.release.derived import check_same_privacy, check_source_release
from dplora.release.keys import load_public_key
from dplora.release.statement import open_statement, sha256_mismatch
from dplora.release.verify import VerifiedRelease, verify_release

# Tolerance of the redone merge (same library, maybe another device): fp32 to 1e-5 relative, 16-bit to one ulp-ish.
MERGE_TOLERANCE = {"float32": (1e-5, 1e-6), "bfloat16": (1e-2, 1e-3), "float16": (1e-3, 1e-4)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedExport:
    """What :func:`verify_export` checked: the manifest's statement, the release, and the redone merge (or None)."""

    statement: dict
    release: VerifiedRelease
    merge_checked: int | None  # tensors compared with a redone merge; None: not redone

    @property
    def differentially_private(self) -> bool:
        """False for a non-private control's export (its release is then one too: checked)."""
        return self.statement.get("predicateType") == EXPORT_PREDICATE_TYPE and self.release.differentially_private


def _statement(folder: Path, public_key) -> dict:
    man = folder / MANIFEST_NAME
    if not man.is_file():
        raise BadInputError(f"--export {folder}: no {MANIFEST_NAME} (not a dplora export folder)")
    statement = open_statement(man, public_key, EXPORT_PREDICATE_TYPES, what="export manifest").statement
    if not isinstance(statement.get("subject"), list) or not statement["subject"]:
        raise VerificationError("export manifest names no files")
    return statement


def _check_files(folder: Path, subjects: list) -> None:
    """Every subject's sha256 matches; every file in the folder (but the manifest) is a subject."""
    names = set()
    for s in subjects:
        ok = isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("digest"), dict)
        if not ok or PurePosixPath(s["name"]).is_absolute() or ".." in PurePosixPath(s["name"]).parts:
            raise VerificationError(f"malformed subject in the export manifest: {str(s)[:80]}")
        path = folder / s["name"]
        if not path.is_file():
            raise VerificationError(f"{s['name']}: file is missing from the export")
        expected = str(s["digest"].get("sha256", "")).lower()
        if not hmac.compare_digest(found := sha256_file(path), expected):
            raise VerificationError(f"{s['name']}: {sha256_mismatch(expected, found)}")
        names.add(s["name"])
    for p in sorted(folder.rglob("*")):
        name = p.relative_to(folder).as_posix()
        if p.is_file() and name != MANIFEST_NAME and name not in names:
            raise VerificationError(f"{name}: file in the export is not covered by its manifest")


def _redo_merge(folder: Path, release_path: Path, base_model: Path) -> int:
    """Merge the release's adapters into ``base_model`` again; compare with the exported tensors. Returns the count."""
    import torch
    from safetensors.torch import load_file

    from dplora.release.read import ADAPTER_DIR

    run = release_path if release_path.is_dir() else release_path.parent
    if not Path(base_model).is_dir():
        raise BadInputError(f"--base-model {base_model}: redoing a merge needs the base's folder, not one file")
    merged, _tok, dtype = merged_model(Path(base_model), run / ADAPTER_DIR)
    ours = merged.state_dict()
    theirs = {}
    for shard in sorted(folder.glob("*.safetensors")):
        theirs.update(load_file(str(shard)))
    rtol, atol = MERGE_TOLERANCE.get(dtype, MERGE_TOLERANCE["bfloat16"])
    missing = sorted(set(theirs) - set(ours))
    if missing or not theirs:
        raise VerificationError(f"the export holds tensors the merge does not make: {', '.join(missing[:3]) or 'none'}")
    for name, tensor in theirs.items():
        mine = ours[name]
        if mine.shape != tensor.shape or not torch.allclose(mine.float(), tensor.float(), rtol=rtol, atol=atol):
            raise VerificationError(f"{name}: the exported weights differ from base + released adapters merged")
    return len(theirs)


def verify_export(
    folder: Path,
    release_path: Path,
    public_key,
    *,
    base_model: Path | None = None,
    release: VerifiedRelease | None = None,
) -> VerifiedExport:
    """Verify an export folder against its signed manifest, the release it names and (optionally) the base model.

    Checks, in order: the release (unless ``release`` is that result already); the manifest's DSSE signature by
    ``public_key``; an in-toto Statement v1 with an export predicate type; every file's sha256 against its subject
    and no unsigned file (one changed byte of a shard fails); ``source_release.record_digest`` is this release's;
    the export's privacy equals the release's; with ``base_model`` for a merged export, the merge redone equals
    the exported tensors (within :data:`MERGE_TOLERANCE` of their dtype).

    Args:
        folder: the ``dplora export`` output folder.
        release_path: the run folder or its ``release.dsse.json``.
        public_key: an Ed25519 public key or the path of its PEM file.
        base_model: the base folder (checked against the record's digests by the caller's ``verify_release``).
        release: an already verified release.
    Returns:
        :class:`VerifiedExport`.
    Raises:
        BadInputError: an unreadable folder, manifest, key or model (exit 2).
        VerificationError: the first mismatch, in one line (exit 3).
    """
    folder = Path(folder)
    if not isinstance(public_key, Ed25519PublicKey):
        public_key = load_public_key(Path(public_key))
    if release is None:
        release = verify_release(release_path, public_key, base_model=base_model)
    if not folder.is_dir():
        raise BadInputError(f"--export {folder}: no such folder")
    statement = _statement(folder, public_key)
    _check_files(folder, statement["subject"])
    predicate = statement.get("predicate") if isinstance(statement.get("predicate"), dict) else {}
    check_source_release(predicate, release_path, what="export")
    private = statement["predicateType"] == EXPORT_PREDICATE_TYPE and predicate.get("differentially_private") is True
    check_same_privacy(
        private,
        release.differentially_private,
        non_private_type=NON_PRIVATE_EXPORT_PREDICATE_TYPE,
        what="export manifest",
    )
    checked = None
    if base_model is not None and predicate.get("format") == "merge":
        checked = _redo_merge(folder, Path(release_path), Path(base_model))
    return VerifiedExport(statement=statement, release=release, merge_checked=checked)
