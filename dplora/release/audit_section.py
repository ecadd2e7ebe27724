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


def composed_runs(record: dict, section: dict) -> list[dict] | None:
    """The two runs a release with an attached private-data audit composes (None: the audit touched no private
    unit): each ``{"run", "epsilon", "delta", "sample_rate", "noise_multiplier", "steps", "accountant"}``."""
    if (section.get("data") or {}).get("source") != "private" or not section.get("mechanism"):
        return None
    acc, mech = record["accounting"], section["mechanism"]
    ledger_eps = (section.get("ledger") or {}).get("epsilon")
    audit_eps = ledger_eps if isinstance(ledger_eps, (int, float)) else section.get("claimed_epsilon")
    return [
        {
            "run": "release",
            "epsilon": acc["epsilon_spent"],
            "delta": acc["delta"],
            "sample_rate": acc["sample_rate"],
            "noise_multiplier": acc["noise_multiplier"],
            "steps": acc["steps_done"],
            "accountant": acc["accountant"],
        },
        {
            "run": "audit",
            "epsilon": audit_eps,
            "delta": mech["delta"],
            "sample_rate": mech["sample_rate"],
            "noise_multiplier": mech["noise_multiplier"],
            "steps": mech["steps"],
            "accountant": mech["accountant"],
        },
    ]


def composed_attack_ceiling(runs: list[dict], adjacency: str) -> dict:
    """The attack ceiling of a release and its attached private-data audit together (issue 46 red team).

    Both runs touched the same units and both sets of outputs are in the signed record, so a membership test may use
    both: the ceiling is that of the two mechanisms composed
    (:func:`dplora.accounting.ceiling_compose.runs_ceiling_entry`), from each run's public q, σ, T and the adjacency
    only, never from a count or an ε. ``dplora verify`` recomputes it.

    Args:
        runs: :func:`composed_claim`'s ``runs`` (``sample_rate``, ``noise_multiplier``, ``steps`` each).
        adjacency: ``"add_remove"`` or ``"replace_one"``.
    Returns:
        A ``ceiling_entry``-style dict (``available`` False with a reason when it cannot be stated).
    Raises:
        ValueError: a run's mechanism numbers are malformed.
    """
    from dplora.accounting.ceiling_compose import runs_ceiling_entry
    from dplora.accounting.events import DpSgdEvent

    events = [DpSgdEvent.from_dict(r, adjacency=adjacency) for r in runs]
    return runs_ceiling_entry(events)
