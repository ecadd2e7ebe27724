"""The audit section's schema, as far as a release checks it: which mechanism fields an attached audit must share
with the release record, read from either side and compared.

Shared by ``dplora verify`` (:func:`dplora.release.verify.verify_release` checks an attached section) and
``dplora audit --attach`` (:mod:`dplora.audit.attach` refuses a mismatched audit), so it sits in the release
stage, below the audit. Standard library only.
"""

from __future__ import annotations

import math

# (name in the section and in messages, (section, key) in the release record); the inputs before σ, which follows
# from them, so that the first mismatch named is the cause
MECHANISM_FIELDS = (
    ("accountant", ("accounting", "accountant")),
    ("protected_unit", ("privacy", "protected_unit")),
    ("adjacency", ("privacy", "adjacency")),
    ("sampler", ("privacy", "sampler")),
    ("clipping", ("privacy", "clipping")),
    ("delta", ("accounting", "delta")),
    ("max_grad_norm", ("mechanism", "max_grad_norm")),
    ("sample_rate", ("accounting", "sample_rate")),
    ("steps", ("accounting", "steps_planned")),
    ("noise_multiplier", ("accounting", "noise_multiplier")),
)


def record_mechanism(record: dict) -> dict:
    """The :data:`MECHANISM_FIELDS` read from a release record (None where the record lacks one)."""
    out = {}
    for name, (section, key) in MECHANISM_FIELDS:
        part = record.get(section)
        out[name] = part.get(key) if isinstance(part, dict) else None
    return out


def same_value(a, b) -> bool:
    """Equal, with numbers compared to 1e-9 relative (a JSON round trip or a recalibration may move the last bit)."""
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return not isinstance(b, bool) and math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def first_mismatch(audit: dict, release: dict) -> str | None:
    """``"name: audit X, release Y"`` for the first mechanism field that differs (:func:`same_value`), else None."""
    for name, _ in MECHANISM_FIELDS:
        if not same_value(a := audit.get(name), r := release.get(name)):
            return f"{name}: audit {a!r}, release {r!r}"
    return None
