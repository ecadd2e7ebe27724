"""A training run compiled once: :class:`RunConfig`, the frozen settings every stage below the recipe reads.

:func:`dplora.recipe.config.compile_run` makes it from the contract, the caller's options and the process group,
and is the last reader of the contract on the training path: the loop, the checkpoint, the engine's model build,
the optimizer and the mechanism read these fields, never the contract or its sections. Modelled on jax_privacy's
``DPExecutionPlan`` (one frozen object made by one function) with torchtune's habit of resolving a recipe's
config before ``setup``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dplora.contract.choices import (
    AttnImplementation,
    Optimizer,
    Precision,
    ProtectedUnit,
    Quantization,
    ReportTo,
    Sharding,
)
from dplora.engine import distributed
from dplora.mechanism.flags import PerformanceFlags
from dplora.plan.training import TrainingPlan


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """The base model as compiled for the run (:class:`dplora.engine.specs.ModelSpec`): a packaged or Hub
    ``name`` (with ``revision``) or a local ``path``, dtype, TF32, attention kernel, quantization."""

    name: str | None
    path: str | None
    revision: str | None
    dtype: Precision
    allow_tf32: bool | None
    attn_implementation: AttnImplementation
    quantization: Quantization


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraSettings:
    """The adapters as compiled for the run (:class:`dplora.engine.specs.LoraSpec`; Hu et al. 2021): rank r,
    alpha, dropout, target modules (a keyword or names), FFA-LoRA's frozen A."""

    r: int
    alpha: float
    dropout: float
    target_modules: str | tuple[str, ...]
    freeze_a: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One training run's settings, fixed before the data is read further than its unit count.

    It satisfies :class:`dplora.engine.specs.ModelBuild`, :class:`dplora.engine.specs.OptimizerSpec` and
    :class:`dplora.engine.specs.WarmStartBuild`, so the engine builds the model, the optimizer and the warm start
    from it directly.

    Attributes:
        plan: q, T, σ, C, B, lr and the ε curve (public; :mod:`dplora.plan.training`).
        flags: how the run is computed (:class:`dplora.mechanism.core.PerformanceFlags`); never the DP event.
        world: the run's processes (:data:`dplora.engine.distributed.SINGLE` unless launched by torchrun/accelerate).
        private: DP (clipping, noise, accountant) or the non-private control (``privacy.enabled: false``): the one
            control switch below planning (the mechanism's ``private`` is made from it).
        unit_mean: per-unit clipping of the mean of a unit's record gradients (``privacy.unit_clipping: mean``).
        population: the ledger population (None: an unassigned run, charged by its output folder).
        protected_unit: row, ticket or user.
        model, lora: the base model and the adapters (:mod:`dplora.engine.specs`).
        seed: the recorded seed (LoRA initialisation, unit hashing; never the noise or sampling).
        optimizer, lr, weight_decay: the optimizer over the LoRA tensors (lr is the plan's).
        max_seq_len: tokens per record after truncation.
        report_to, report_private: the experiment tracker and whether it also gets private numbers.
        output_dir: the output folder as the contract names it (resolved by :mod:`dplora.run.outputs`).
        base_model_name: the base model as an adapter config names it (a name, never a local path).
        data_file_name: the data file's name (no folder), for the checkpoint's data check (the data spec itself
            stays with the recipe, which hands it to the data stage).
        contract_yaml, contract_sha256: the resolved contract as written into the release and the checkpoint.
    """

    plan: TrainingPlan
    flags: PerformanceFlags
    world: distributed.World = distributed.SINGLE
    private: bool = True
    unit_mean: bool = False
    population: str | None = None
    protected_unit: ProtectedUnit = ProtectedUnit.ROW
    model: ModelSettings
    lora: LoraSettings
    seed: int = 0
    optimizer: Optimizer = Optimizer.ADAMW
    lr: float
    weight_decay: float = 0.0
    max_seq_len: int
    report_to: ReportTo = ReportTo.NONE
    report_private: bool = False
    output_dir: str
    base_model_name: str
    data_file_name: str
    contract_yaml: str
    contract_sha256: str

    @property
    def gradient_checkpointing(self) -> bool:
        """:class:`dplora.engine.specs.ModelBuild`: recompute activations in the backward."""
        return self.flags.gradient_checkpointing

    @property
    def sharding(self) -> Sharding:
        """:class:`dplora.engine.specs.ModelBuild`: where the base weights live."""
        return self.flags.sharding

    @property
    def sharded_base(self) -> bool:
        """``training.sharding: fsdp``: with W > 1 every forward is collective (no rank may forward alone)."""
        return self.flags.sharding is Sharding.FSDP

    @property
    def fixed_physical_batch_size(self) -> int:
        """:class:`dplora.engine.specs.WarmStartBuild`: records per forward as a number (``auto`` reads as 8)."""
        return self.flags.fixed_physical_batch_size

    @property
    def charged(self) -> bool:
        """Whether the run holds a ledger charge: every DP run (unassigned without a population), a control on one."""
        return bool(self.population) or self.private

    @property
    def output_path(self) -> Path:
        """``output_dir`` as a path (not resolved)."""
        return Path(self.output_dir)

    def mechanism(self):
        """The run's :class:`dplora.mechanism.core.DPMechanism` from its one constructor
        (:func:`dplora.mechanism.core.make_mechanism`): the plan, the flags, the processes and the control switch.

        Raises:
            ValueError: the plan's q, σ or T cannot make a DP-SGD event (see ``make_mechanism``).
        """
        from dplora.mechanism.core import make_mechanism

        return make_mechanism(self.plan, self.flags, self.world, private=self.private, unit_mean=self.unit_mean)
