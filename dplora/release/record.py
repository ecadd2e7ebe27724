"""The release record: the JSON predicate signed into the DSSE envelope (see ``release.py``).

Everything here is public by construction: the contract's privacy settings, the mechanism as data (the
``DpSgdEvent``), the accountant and its version, library versions, digests. Never raw text, never losses on
private data, never per-unit record counts (the maximum is one person's count). The ``attack_ceiling`` entry
(:mod:`dplora.accounting.ceiling`) is computed from the mechanism entry's public q, σ, T and adjacency. An
optional ``audit`` section is added after training by ``dplora audit --attach`` (:mod:`dplora.audit.attach`): an
audit's summary numbers on fake canaries, no secrets and no scores.
"""

from __future__ import annotations

import importlib.metadata
import platform

import dplora
from dplora.accounting.ceiling import ceiling_entry
from dplora.contract.choices import ProtectedUnit
from dplora.contract.spec import Contract, LoraSection, ModelSection, PrivacySection
from dplora.mechanism.control import NO_DP_STATEMENT
from dplora.plan.training import TrainingPlan

CONTROL_RECORD_VERSION = 1  # the non-private control's record (non_private_record)
RECORD_VERSION = 2  # 2: base_model (name and file digests); artifacts filled by the release
SEED_SCOPE = (
    "seeds the data-cap choice, the held-out split and the LoRA initialisation only; Poisson sampling and the "
    "Gaussian noise draw from OS entropy and cannot be reproduced from this record"
)


def library_versions() -> dict[str, str]:
    """Versions of the libraries whose code computed the adapters and ε."""
    names = ("torch", "opacus", "peft", "transformers", "dp-accounting", "datasets")
    out = {"dplora": dplora.__version__, "python": platform.python_version()}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def unit_guarantee(privacy: PrivacySection) -> dict:
    """What the protected unit covers, in words and as fields (Charles et al. 2024 construction for units)."""
    unit = privacy.protected_unit
    out = {
        "protected_unit": unit.value,
        "unit_key": privacy.unit_key,
        "adjacency": privacy.adjacency.value,
        "sampler": privacy.sampling.value,
        "clipping": (
            "per-record gradient clipped to C (each record is one unit)"
            if unit is ProtectedUnit.ROW
            else f"per-unit: {privacy.unit_clipping.value} of the unit's per-record gradients, clipped to C"
        ),
        "contribution_bound": {
            "max_records_per_unit": privacy.max_records_per_unit,
            "note": "compute bound only; privacy comes from the per-unit clip",
        },
    }
    out["statement"] = unit_statement(unit)
    return out


def unit_statement(unit: ProtectedUnit) -> str:
    """The guarantee in words, as the release record, ``budget`` and ``train`` all state it."""
    match ProtectedUnit(unit):
        case ProtectedUnit.ROW:
            return (
                "bounds what one data row reveals, not a ticket or a customer: "
                "NOT a ticket-level or customer-level guarantee"
            )
        case ProtectedUnit.TICKET:
            return (
                "bounds what one whole ticket reveals; a customer with k tickets is protected only by group "
                "privacy, about k·ε; use protected_unit: user for customer-level protection"
            )
        case ProtectedUnit.USER:
            return "bounds what one whole customer (all of their records) reveals"
    raise ValueError(f"unknown protected_unit={unit!r}")  # pragma: no cover


def build_record(
    *,
    contract: Contract,
    plan: TrainingPlan,
    run_id: str,
    steps_done: int,
    epsilon_spent: float,
    started_at: str,
    data_digest: dict,
    base_model: dict,
    execution: dict | None = None,
    lora_targets: list[str] | None = None,
) -> dict:
    """The JSON record of one fully accounted run (steps_done == plan.steps).

    The ``artifacts`` list is added when the release is finished (:func:`dplora.release.envelope.finish_release`).

    Args:
        base_model: :func:`dplora.engine.basefiles.base_model_entry`: a loadable name and the sha256 of the files
            trained on.
    Returns:
        A dict ready for canonical JSON (str/int/float/bool/None/list/dict only).
    """
    return {
        "record_version": RECORD_VERSION,
        "run_id": run_id,
        "started_at": started_at,  # taken before the data is read; no end time (it would time the private run)
        "privacy": unit_guarantee(contract.privacy),
        "mechanism": {
            **plan.event.to_dict(),
            "max_grad_norm": plan.max_grad_norm,
            "noise_std": plan.noise_multiplier * plan.max_grad_norm,
            "normalizer": {"expected_units_per_step": plan.expected_batch_size, "public": True},
            "noise_source": "ChaCha20 keyed with 256 bits from os.urandom (never seeded from the record)",
            **clipping_entry(plan),
        },
        "optimization": optimization_entry(plan, contract.training.optimizer.value),
        "accounting": {
            "accountant": plan.accountant.value,
            "accountant_version": plan.accountant_version,
            "accountant_note": plan.accountant_note,
            "delta": plan.delta,
            "target_epsilon": plan.target_epsilon,
            "epsilon_spent": epsilon_spent,
            "sample_rate": plan.sample_rate,
            "noise_multiplier": plan.noise_multiplier,
            "noise_multiplier_source": plan.noise_source,
            "steps_planned": plan.steps,
            "steps_done": steps_done,
            "num_units": plan.num_units,
            "num_units_source": plan.num_units_source,
            "num_units_note": num_units_note(plan.num_units_source),
            "composition": "single run; see `dplora ledger` for releases on the same population",
        },
        "attack_ceiling": ceiling_entry(plan.event),  # from the public q, σ, T, adjacency only
        "population": contract.privacy.population,
        **run_provenance(
            contract, base_model=base_model, data_digest=data_digest, execution=execution, lora_targets=lora_targets
        ),
        "not_included": "training losses and per-unit record counts (computed on private data, not covered by ε)",
    }


def clipping_entry(plan: TrainingPlan) -> dict:
    """``clipping``: clip or normalize, with the public γ of normalize (sensitivity C either way)."""
    from dplora.contract.spec import NORMALIZE_GAMMA

    clipping = getattr(plan, "clipping", "clip")
    entry = {"clipping": clipping}
    if clipping == "normalize":
        entry["normalize_gamma"] = NORMALIZE_GAMMA * plan.max_grad_norm
    return entry


def optimization_entry(plan: TrainingPlan, optimizer: str = "adamw") -> dict:
    """The optimizer by name with its public parameters (:func:`optimizer_entry`), lr, schedule, warmup and weight
    decay (all data-independent), and the planner's table when it chose B and T."""
    out = {
        "optimizer": optimizer_entry(optimizer, plan),
        "lr": plan.lr,
        "lr_schedule": plan.lr_schedule,
        "warmup_steps": plan.warmup_steps,
        "weight_decay": plan.weight_decay,
    }
    if plan.planner is not None:
        out["planner"] = plan.planner
    return out


def optimizer_entry(name: str, plan: TrainingPlan) -> dict:
    """The torch optimizer that consumed the noised gradient, with its public parameters.

    The optimizer is post-processing of the noised, normalised gradient (no privacy effect), but a reviewer
    reproducing the run needs it: AdamW, Adam and SGD at torch's defaults (as :func:`dplora.mechanism.adambc.
    make_optimizer` builds them), and DP-AdamBC with the noise variance Φ = (σC/E)² it removes from Adam's second
    moment (Tang, Shpilevskiy & Lécuyer, AAAI 2024, Algorithm 1), from the plan's public σ, C and E.

    Args:
        name: ``training.optimizer`` (``adamw``, ``adam``, ``sgd`` or ``dp_adambc``).
        plan: the run's plan (σ, C, E for Φ).
    Returns:
        ``{"name", ...parameters}``, JSON-ready.
    Raises:
        ValueError: a plan whose σ, C or E make Φ undefined (:func:`dplora.mechanism.core.noise_variance`).
    """
    if name == "sgd":
        return {"name": "sgd", "momentum": 0.0}
    if name == "dp_adambc":
        from dplora.mechanism.adambc import DEFAULT_GAMMA
        from dplora.mechanism.core import noise_variance

        return {
            "name": "dp_adambc",
            "betas": [0.9, 0.999],
            "gamma": DEFAULT_GAMMA,
            "noise_variance_phi": noise_variance(plan),
            "phi_formula": "(noise_multiplier * max_grad_norm / expected_units_per_step)^2, the planned normalizer",
            "source": "Tang, Shpilevskiy and Lécuyer, DP-AdamBC, AAAI 2024 (arXiv 2312.14334), Algorithm 1",
        }
    return {"name": name, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay_form": _DECAY_FORM[name]}


_DECAY_FORM = {"adamw": "decoupled", "adam": "L2 in the gradient"}


def num_units_note(source: str) -> str:
    """Why the record's N is public: declared in the contract, or counted where neighbours share N."""
    if source == "contract":
        return (
            "declared in the contract as a public number; q, T, σ and the δ < 1/N check use it (the data's count "
            "is compared with it locally and never written here)"
        )
    return (
        "counted in the data; public under replace-one adjacency: neighbouring datasets hold the same number of "
        "units and no held-out split or drop rule moves a unit out of the training side"
    )


def run_provenance(
    contract: Contract, *, base_model: dict, data_digest: dict, execution: dict | None, lora_targets=None
) -> dict:
    """The record entries a DP run and its non-private control share: what was trained, on what, with what.

    LoRA and model settings, the base model's digests, library versions, the contract and data digests, the seed
    and its scope, and the execution entry (device, dtypes, noise generator). Public by construction.

    Args:
        contract: The validated contract.
        base_model: :func:`dplora.engine.basefiles.base_model_entry`.
        data_digest: :func:`dplora.release.envelope.data_digest_entry` (sha256 or keyed HMAC of the data files).
        execution: :func:`dplora.run.execution.execution_entry`, or None for ``{}``.
        lora_targets: the leaf names of the modules that hold adapters
            (:func:`dplora.engine.lora.adapted_module_names`);
            they replace ``auto``/``all-linear`` as ``lora.target_modules`` (the contract's value stays in
            ``lora.target_modules_requested``). None: the contract's list as written.
    Returns:
        A dict of JSON values, merged into :func:`build_record` and
        :func:`non_private_record`.
    """
    return {
        "lora": _lora_entry(contract.lora, lora_targets),
        "model": model_entry(contract.model, base_model),
        "base_model": base_model,
        "versions": library_versions(),
        "contract": {"file": "contract.yaml", "sha256": contract.sha256},
        "data": {"files": [contract.data.path.rsplit("/", 1)[-1]], "digest": data_digest},
        "seed": {"value": contract.training.seed, "scope": SEED_SCOPE},
        "execution": execution or {},
    }


def model_entry(model: ModelSection, base_model: dict) -> dict:
    """The record's ``model``: the contract's model settings with ``model.path`` replaced by the file or folder name
    and a sha256, never the training machine's path (which names a user, a host layout, a mount: the signed
    ``adapter_config.json`` avoids machine paths for the same reason).

    ``sha256`` is the file's for a ``.gguf`` path; for a folder (and a packaged or Hub model) it is the sha256
    (FIPS 180-4) of the canonical JSON (sorted keys, no spaces) of ``base_model.files``, the {file name: sha256}
    of every file trained on, so one digest names the exact base.

    Args:
        model: the contract's model section.
        base_model: :func:`dplora.engine.basefiles.base_model_entry` (its ``files``).
    Returns:
        A JSON-ready dict without ``path``.
    """
    import hashlib
    import json
    from pathlib import PurePath

    entry = model.model_dump(mode="json")
    path = entry.pop("path", None)
    files = base_model.get("files") if isinstance(base_model, dict) else None
    if path is not None:
        entry["file"] = PurePath(path).name
    if isinstance(files, dict) and path is not None and entry["file"] in files and path.endswith(".gguf"):
        entry["sha256"] = files[entry["file"]]
        entry["sha256_of"] = "the .gguf file"
    elif isinstance(files, dict) and files:
        canonical = json.dumps(files, sort_keys=True, separators=(",", ":")).encode()
        entry["sha256"] = hashlib.sha256(canonical).hexdigest()
        entry["sha256_of"] = "the canonical JSON of base_model.files ({file name: sha256} of every file trained on)"
    return entry


def warm_start_entry(entry: dict) -> dict:
    """The record's ``public_warm_start``: the public file by name and sha256 (``file``, ``sha256``), its records,
    steps, batch size, lr and optimizer, without the contract's ``path`` (a path of the training machine)."""
    return {k: v for k, v in entry.items() if k != "path"}


def _lora_entry(lora: LoraSection, lora_targets: list[str] | None) -> dict:
    entry = lora.model_dump(mode="json")
    if lora_targets is not None:
        entry["target_modules_requested"] = entry["target_modules"]
        entry["target_modules"] = sorted(lora_targets)
    return entry


def non_private_record(
    *,
    contract: Contract,
    plan: TrainingPlan,
    run_id: str,
    steps_done: int,
    started_at: str,
    data_digest: dict,
    base_model: dict,
    execution: dict | None = None,
    lora_targets: list[str] | None = None,
) -> dict:
    """The signed record of a control run (predicate type ``NON_PRIVATE_PREDICATE_TYPE``, never the DP one).

    It says in words and as a field that the run is not differentially private, and records what the control
    shares with its DP twin (unit, q, T, normaliser) so the two can be compared. No losses, no record counts.
    ``differentially_private: false`` makes :func:`dplora.release.envelope.predicate_type_of` sign it as
    ``NON_PRIVATE_PREDICATE_TYPE``; the ``artifacts`` list is added when the release is finished.

    Returns:
        A dict ready for canonical JSON.
    """
    privacy = contract.privacy
    return {
        "record_version": CONTROL_RECORD_VERSION,
        "run_id": run_id,
        "started_at": started_at,  # taken before the data is read; no end time (it would time the private run)
        "differentially_private": False,
        "statement": NO_DP_STATEMENT,
        "epsilon": "infinite",
        "control_of": {
            "protected_unit": privacy.protected_unit.value,
            "unit_key": privacy.unit_key,
            "adjacency": privacy.adjacency.value,
            "population": privacy.population,
            "note": "the DP contract this run is the non-private control of (same sampling and steps)",
        },
        "training": {
            "sampler": privacy.sampling.value,
            "sample_rate": plan.sample_rate,
            "steps_planned": plan.steps,
            "steps_done": steps_done,
            "num_units": plan.num_units,
            "num_units_source": plan.num_units_source,
            "normalizer": {"expected_units_per_step": plan.expected_batch_size, "public": True},
            "clipping": "none",
            "noise": "none",
        },
        **run_provenance(
            contract, base_model=base_model, data_digest=data_digest, execution=execution, lora_targets=lora_targets
        ),
        "not_included": "training losses and per-unit record counts",
    }
