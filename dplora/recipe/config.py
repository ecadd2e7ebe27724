"""Compile once: a training run's :class:`dplora.run.config.RunConfig` from the contract, the caller's options and
the process group. The last reader of the contract on the training path (the stages below read the config).

Also what a caller chooses besides the contract (:class:`RunOptions`), what a run gives back (:class:`RunResult`)
and the inputs a run's output folder must not hold (:func:`protected_inputs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dplora.contract.choices import UnitClipping
from dplora.contract.spec import Contract
from dplora.engine import distributed
from dplora.ledger.store import default_ledger_path
from dplora.mechanism.flags import PerformanceFlags
from dplora.plan.training import TrainingPlan
from dplora.release.envelope import data_key_path
from dplora.release.keys import signing_key_path
from dplora.run.config import LoraSettings, ModelSettings, RunConfig

if TYPE_CHECKING:
    from dplora.evaluate.heldout import Evaluation


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    """The options of :func:`dplora.recipe.train.run_training`; none of them changes the DP mechanism.

    Attributes:
        signing_key: Ed25519 private key PEM (else ``$DPLORA_SIGNING_KEY``).
        data_key: the data owner's HMAC key file (else ``$DPLORA_DATA_KEY``; else no keyed data digest).
        ledger_path: SQLite budget ledger (else ``$DPLORA_LEDGER`` or the user data dir).
        overwrite: replace a previous dplora run's output folder (only after the new run succeeded).
        resume: continue from the resume checkpoint in ``<output_dir>.partial`` (same contract and data).
        threads: CPU threads (None: the cores free now).
        progress: report progress on stderr (a bar on a terminal, plain lines otherwise).
        tuning_trial: charge the ledger as a hyperparameter-tuning trial (it counts like any release).
        non_private: allow a ``privacy.enabled: false`` control on a ledger population (charged ε = ∞).
        contract_path: the contract file, which the output folder must not hold.
        ledger_release: record the signed release in the ledger (False: a ``dplora sweep`` trial, signed with a
            throw-away key; the charge is the same).
        extra_records: rows appended to the training table after the held-out split (the audit's canaries, each
            its own protected unit); every column of the data file, text values.
        on_progress: called after every logical step with public values only: (step, T, the plan's ε after it).
    """

    signing_key: Path | None = None
    data_key: Path | None = None
    ledger_path: Path | None = None
    overwrite: bool = False
    resume: bool = False
    threads: int | None = None
    progress: bool = True
    tuning_trial: bool = False
    non_private: bool = False
    contract_path: Path | None = None
    ledger_release: bool = True
    extra_records: tuple[dict, ...] = ()
    on_progress: Callable[[int, int, float], None] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunResult:
    """What a finished run produced (seconds are wall-clock); ``release_path`` is None on ranks other than 0.

    ``seconds`` is the whole run after setup; ``seconds_per_step`` the loop of steps alone over the steps taken;
    ``eval_seconds`` the held-out evaluation alone (0.0 without one). Printed to the operator, never released.
    ``summary`` is ``train --json`` (:func:`dplora.release.report.train_summary`; None on ranks other than 0).
    """

    output_dir: Path
    release_path: Path | None
    plan: TrainingPlan
    steps_done: int
    empty_steps: int
    epsilon_spent: float
    seconds: float
    seconds_per_step: float
    threads: int
    differentially_private: bool = True
    evaluation: Evaluation | None = None
    eval_seconds: float = 0.0
    run_id: str = ""
    summary: dict | None = None


def compile_run(
    contract: Contract, plan: TrainingPlan, options: RunOptions, world: distributed.World = distributed.SINGLE
) -> RunConfig:
    """The run's frozen settings: the plan, every performance setting, the model, LoRA and output specs (the data
    spec, ``contract.data``, goes to the data stage from the recipe).

    Args:
        contract: the validated, ``auto``-resolved contract.
        plan: its plan (:func:`dplora.plan.resolve.plan_for`; the control's from
            :func:`dplora.plan.training.control_plan`).
        options: the caller's options (``threads`` wins over ``training.threads``).
        world: the run's processes.
    Returns:
        :class:`dplora.run.config.RunConfig`.
    Raises:
        Nothing of its own: the contract was validated when loaded.
    """
    privacy, training, model, lora = contract.privacy, contract.training, contract.model, contract.lora
    flags = PerformanceFlags(
        per_sample=privacy.per_sample,
        physical_batch_size=training.physical_batch_size,
        gradient_checkpointing=training.gradient_checkpointing,
        sharding=training.sharding,
        threads=options.threads or training.threads,
        dtype=model.dtype,
        attn_implementation=model.attn_implementation,
        checkpoint_every=training.checkpoint_every,
    )
    return RunConfig(
        plan=plan,
        flags=flags,
        world=world,
        private=privacy.enabled,
        unit_mean=privacy.unit_clipping is UnitClipping.MEAN,
        population=privacy.population or None,
        protected_unit=privacy.protected_unit,
        model=ModelSettings(
            name=model.name,
            path=model.path,
            revision=model.revision,
            dtype=model.dtype,
            allow_tf32=model.allow_tf32,
            attn_implementation=model.attn_implementation,
            quantization=model.quantization,
        ),
        lora=LoraSettings(
            r=lora.r,
            alpha=lora.alpha,
            dropout=lora.dropout,
            target_modules=lora.target_modules,
            freeze_a=lora.freeze_a,
        ),
        seed=training.seed,
        optimizer=training.optimizer,
        lr=training.lr,
        weight_decay=training.weight_decay,
        max_seq_len=training.max_seq_len,
        report_to=training.report_to,
        report_private=training.report_private,
        output_dir=training.output_dir,
        base_model_name=model.name or Path(model.path).name,
        data_file_name=Path(contract.data.path).name,
        contract_yaml=contract.to_yaml(),
        contract_sha256=contract.sha256,
    )


def protected_inputs(contract, *, contract_path, signing_key, data_key, ledger_path) -> list[tuple[str, Path]]:
    """The run's inputs that its output folder must not hold: contract, data, model, keys, ledger.

    Keys and the ledger given through the environment (``$DPLORA_SIGNING_KEY``, ``$DPLORA_DATA_KEY``,
    ``$DPLORA_LEDGER`` or the default ledger path) are included.
    """
    signing = signing_key_path(signing_key)
    items = [
        ("the contract", contract_path),
        ("the data file", contract.data.path),
        ("the model", contract.model.path),
        ("the signing key", signing),
        ("the public key", signing.with_suffix(".pub") if signing else None),
        ("the data key", data_key_path(data_key)),
        ("the ledger", ledger_path or default_ledger_path()),
    ]
    return [(what, Path(p)) for what, p in items if p]
