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
    """The runs a release with an attached private-data audit composes (None: the audit touched no private unit):
    each ``{"run", "epsilon", "delta", "sample_rate", "noise_multiplier", "steps", "accountant"}``.

    The release's own run, or, for a ``dplora sweep`` release (a ``tuning`` entry), every trial of the sweep: the
    signed record is a function of all of them (:func:`tuning_runs`); then the audit run."""
    if (section.get("data") or {}).get("source") != "private" or not section.get("mechanism"):
        return None
    acc, mech = record["accounting"], section["mechanism"]
    ledger_eps = (section.get("ledger") or {}).get("epsilon")
    audit_eps = ledger_eps if isinstance(ledger_eps, (int, float)) else section.get("claimed_epsilon")
    release = tuning_runs(record) or [
        {
            "run": "release",
            "epsilon": acc["epsilon_spent"],
            "delta": acc["delta"],
            "sample_rate": acc["sample_rate"],
            "noise_multiplier": acc["noise_multiplier"],
            "steps": acc["steps_done"],
            "accountant": acc["accountant"],
        }
    ]
    return [
        *release,
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


RUN_KEYS = ("epsilon", "delta", "sample_rate", "noise_multiplier", "steps", "accountant")


def tuning_runs(record: dict) -> list[dict] | None:
    """Every trial of a ``dplora sweep`` release as a run (``{"run": "trial k", ...}``, :data:`RUN_KEYS` from
    ``tuning.per_trial``), or None for a record without a ``tuning`` entry.

    Raises:
        KeyError, TypeError: a malformed ``tuning.per_trial`` (a trial without one of :data:`RUN_KEYS`).
    """
    tuning = record.get("tuning")
    if not isinstance(tuning, dict):
        return None
    trials = tuning["per_trial"]
    if not isinstance(trials, list) or not trials:
        raise TypeError("tuning.per_trial is not a non-empty list")
    return [{"run": f"trial {k}", **{key: t[key] for key in RUN_KEYS}} for k, t in enumerate(trials, start=1)]


def sweep_scope(trials: int, covered: bool) -> tuple[str, str]:
    """(scope, holds_for) of a sweep release's attack ceiling: the chosen trial and every trial it was chosen from;
    with a private selection set, the choice itself is NOT COVERED (no accountant charges it)."""
    scope = (
        f"the chosen trial and all {trials} trials of the sweep it was chosen from together (each a DP run on the "
        "same units; the signed tuning entry is a function of every trial)"
    )
    holds_for = f"the chosen trial and the {trials} trials it was chosen from together"
    if not covered:
        holds_for += (
            ", but NOT for the choice itself: it used a private selection set that no accountant charges (NOT COVERED)"
        )
    return scope, holds_for


def tuning_attack_ceiling(trials: list[dict], adjacency: str, *, covered: bool) -> dict:
    """The attack ceiling of a ``dplora sweep`` release: all trials' mechanisms composed.

    Picking the best trial publishes a function of every trial (Papernot & Steinke, ICLR 2022), and the signed
    ``tuning`` entry states each trial's numbers, so a membership test may use all of them: the ceiling is that of
    every trial's q, σ, T composed (:func:`dplora.accounting.ceiling_compose.runs_ceiling_entry`, the composition
    of a release and its attached audit), from public numbers only; ``dplora verify`` recomputes it.

    Args:
        trials: the trials as runs (``sample_rate``, ``noise_multiplier``, ``steps`` each; :func:`tuning_runs`).
        adjacency: ``"add_remove"`` or ``"replace_one"``.
        covered: the choice used a public selection set only (else its words say NOT COVERED).
    Returns:
        A ``ceiling_entry``-style dict with ``scope`` and ``holds_for`` (:func:`sweep_scope`).
    Raises:
        ValueError: a trial's mechanism numbers are malformed, or no trials.
    """
    from dplora.accounting.ceiling_compose import runs_ceiling_entry
    from dplora.accounting.events import DpSgdEvent

    events = [DpSgdEvent.from_dict(t, adjacency=adjacency) for t in trials]
    scope, holds_for = sweep_scope(len(events), covered)
    return runs_ceiling_entry(events, scope=scope, holds_for=holds_for)


def composed_attack_ceiling(runs: list[dict], adjacency: str) -> dict:
    """The attack ceiling of a release and its attached private-data audit together.

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
    if any(str(r.get("run", "")).startswith("trial ") for r in runs):  # a sweep release with an attached audit
        trials = sum(str(r.get("run", "")).startswith("trial ") for r in runs)
        scope = (
            f"all {trials} trials of the sweep this release was chosen from and the audit run attached to it "
            "together (DP runs on the same units, all in the signed record)"
        )
        holds_for = f"the chosen trial, the {trials} trials it was chosen from and the attached audit run together"
        return runs_ceiling_entry(events, scope=scope, holds_for=holds_for)
    return runs_ceiling_entry(events)
