"""Report once: the public facts of a finished training run, and the one writer of its signed record, its model
card and ``dplora train --json``.

:class:`PublicFacts` holds values only, each public by construction: the contract and its plan (public inputs),
the steps taken and ε spent at them (the plan's curve at integer T: DP outputs), the start time (taken before any
data was read), digests of public or keyed files, and descriptions of the execution that depend on the contract,
the machine and the libraries, never on the data. Nothing here reads a private count, timing or text, so no key
of the record, the card or the summary can carry one. A test fails when a record key is written anywhere else.

Other writers of records extend a record this module made (a sweep's ``tuning``, an intermediate release from a
checkpoint, an audit section) through :func:`extend`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dplora.contract.spec import Contract
from dplora.plan.training import TrainingPlan
from dplora.release import envelope
from dplora.release.record import build_record, non_private_record, warm_start_entry


@dataclasses.dataclass(frozen=True, kw_only=True)
class PublicFacts:
    """What a finished (or checkpointed) run may say in public.

    Attributes:
        contract: the resolved contract (public: the user's declared settings).
        plan: its plan (q, T, σ, C, the ε curve).
        run_id: 32 hex characters (random, from the OS).
        steps_done: logical steps taken (= T for a final release).
        epsilon_spent: ε at ``steps_done`` on the plan's curve (the control: ∞, not stated).
        private: a DP run (False: the non-private control, signed as such).
        started_at: UTC, taken before the data was read: the record's only time.
        data_digest: :func:`dplora.release.envelope.data_digest_entry` (plain or keyed sha256 of the data file).
        base_model: :func:`dplora.engine.basefiles.base_model_entry` (the public base model's files by sha256).
        execution: :func:`dplora.run.execution.execution_entry` (device, dtype, kernels, processes).
        lora_targets: the module names the adapters were put on.
        tokenization: :func:`dplora.data.chat.tokenization_entry` (the chat template's digest), or None.
        warm_start: the public warm start's entry, or None.
        evaluation: a held-out evaluation on a set declared public, or None (a private set's numbers never enter).
        intermediate: for a release signed from a resume checkpoint, its steps and a note; else None.
    """

    contract: Contract
    plan: TrainingPlan
    run_id: str
    steps_done: int
    epsilon_spent: float
    private: bool
    started_at: str
    data_digest: dict
    base_model: dict
    execution: dict
    lora_targets: list[str]
    tokenization: dict | None = None
    warm_start: dict | None = None
    evaluation: dict | None = None
    intermediate: dict | None = None


def record(facts: PublicFacts) -> dict:
    """The release record (without ``artifacts``, added when it is signed) of ``facts``.

    Returns:
        The DP record (:func:`dplora.release.record.build_record`) or, for the control, the non-private one
        (:func:`dplora.release.record.non_private_record`, its own predicate type and no ε).
    """
    common = {
        "contract": facts.contract,
        "plan": facts.plan,
        "run_id": facts.run_id,
        "steps_done": facts.steps_done,
        "started_at": facts.started_at,
        "data_digest": facts.data_digest,
        "base_model": facts.base_model,
        "execution": facts.execution,
        "lora_targets": facts.lora_targets,
    }
    if facts.private:
        out = build_record(**common, epsilon_spent=facts.epsilon_spent)
    else:
        out = non_private_record(**common)
    return extend(
        out,
        tokenization=facts.tokenization,
        public_warm_start=None if facts.warm_start is None else warm_start_entry(facts.warm_start),
        evaluation=facts.evaluation,
        intermediate=facts.intermediate,
    )


def extend(base: dict, **sections) -> dict:
    """``base`` with the named top-level sections set (None values are left out); the record's one way to grow.

    Raises:
        ValueError: a section would replace one of the record's own keys other than those named here for that
            purpose (``tokenization``, ``public_warm_start``, ``evaluation``, ``intermediate``, ``tuning``,
            ``accounting``, ``attack_ceiling``, ``audit``).
    """
    allowed = {
        "tokenization",
        "public_warm_start",
        "evaluation",
        "intermediate",
        "tuning",
        "accounting",
        "attack_ceiling",
        "audit",
    }
    out = dict(base)
    for key, value in sections.items():
        if value is None:
            continue
        if key in out and key not in allowed:
            raise ValueError(f"the record's {key!r} is written once, by dplora.release.report.record")
        out[key] = value
    return out


def sign(facts: PublicFacts, folder: Path, *, private_key) -> Path:
    """Write the record of ``facts``, the model card and the signed envelope into ``folder`` (which holds
    ``adapter/`` and ``contract.yaml``). Returns the envelope's path (:func:`dplora.release.envelope.finish_release`).

    Raises:
        BadInputError: see :func:`dplora.release.envelope.finish_release`.
    """
    return envelope.finish_release(folder, facts.contract.data, record(facts), private_key=private_key)


def train_summary(facts: PublicFacts, output_dir: Path, *, threads: int) -> dict:
    """``dplora train --json``: the run id, the plan's public numbers, ε spent and the paths written.

    Public fields only: realised timings and empty steps are in ``<output_dir>.private/report.json``. ``threads``
    is the operator's setting (or the cores free at the start), not a function of the data.
    """
    from dplora.run import outputs

    p, folder = facts.plan, Path(output_dir).absolute()
    bundle = folder / envelope.SIGSTORE_FILENAME
    private = outputs.private_path(folder)
    return {
        "ok": True,
        "run_id": facts.run_id,
        "differentially_private": facts.private,
        "protected_unit": p.protected_unit.value,
        "unit_key": p.unit_key,
        "adjacency": p.adjacency.value,
        "num_units": p.num_units,
        "num_units_source": p.num_units_source,
        "expected_batch_size": p.expected_batch_size,
        "sample_rate": p.sample_rate,
        "steps": p.steps,
        "steps_done": facts.steps_done,
        "noise_multiplier": p.noise_multiplier,
        "max_grad_norm": p.max_grad_norm,
        "epsilon_spent": facts.epsilon_spent,
        "target_epsilon": p.target_epsilon,
        "delta": p.delta,
        "accountant": p.accountant.value,
        "accountant_version": p.accountant_version,
        "paths": {
            "output_dir": str(folder),
            "adapter": str(folder / "adapter"),
            "release": str(folder / envelope.RELEASE_FILENAME),
            "sigstore_bundle": str(bundle) if bundle.is_file() else None,
            "private_dir": str(private),
            "metrics": str(private / outputs.METRICS_FILENAME),
        },
        "threads": threads,
    }


def resign(folder: Path, base: dict, *, private_key, data, **sections) -> Path:
    """Sign ``base`` (a verified record of this module, its ``artifacts`` dropped) again with ``sections`` added
    (:func:`extend`): the card is written again from it. A sweep's chosen trial gets its ``tuning`` this way.

    Args:
        folder: the release folder (``adapter/``, ``contract.yaml``); its old record files are replaced.
        base: the record to extend; data: the contract's data section (the card names the columns).
    Returns:
        The new envelope's path.
    Raises:
        ValueError: see :func:`extend`; BadInputError: see :func:`dplora.release.envelope.finish_release`.
    """
    record_ = extend({k: v for k, v in base.items() if k != "artifacts"}, **sections)
    for name in envelope.RELEASE_FILES:
        (Path(folder) / name).unlink(missing_ok=True)
    return envelope.finish_release(folder, data, record_, private_key=private_key)


def rewrite_card(folder: Path, record_: dict, data) -> None:
    """Write ``adapter/README.md`` again from ``record_`` (an attached audit section states its claim there too),
    if the release has a card. The caller signs the record and the card together afterwards (:func:`sign_as_is`)."""
    from dplora.atomic import write_text
    from dplora.release.card import model_card

    card = Path(folder) / "adapter" / envelope.MODEL_CARD
    if card.is_file():
        write_text(card, model_card(record_, data))


def sign_as_is(folder: Path, record_: dict, artifacts: list[Path], *, private_key) -> Path:
    """Sign ``record_`` over ``artifacts`` (names relative to ``folder``) without changing a file: an audit's
    attach re-signs the release it extended. Raises: as :func:`dplora.release.envelope.write_release`."""
    return envelope.write_release(output_dir=folder, record=record_, artifact_files=artifacts, private_key=private_key)
