"""What the engine reads of a run's settings, named as structural types (``typing.Protocol``).

The engine loads models, wraps them with LoRA and builds optimizers; it never reads the contract. Its functions take
these views instead, so the contract's schema can change without touching the engine, and a caller can hand it
any frozen object with the fields (the recipe's compiled :class:`dplora.run.config.RunConfig` passes the
contract's validated sections, which have them; tests pass small stand-ins). Modelled on jax_privacy, whose
``DPExecutionPlan`` takes configs by their fields rather than the experiment's whole config tree.
"""

from __future__ import annotations

from typing import Protocol

from dplora.contract.choices import AttnImplementation, Optimizer, Precision, Quantization, Sharding


class ModelSpec(Protocol):
    """The base model to load: a packaged or Hub name (``name``, ``revision``) or a local ``path``; the base
    weights' dtype, TF32 for fp32 matmuls (None: the device's default), attention kernel and quantization."""

    name: str | None
    path: str | None
    revision: str | None
    dtype: Precision
    allow_tf32: bool | None
    attn_implementation: AttnImplementation
    quantization: Quantization


class LoraSpec(Protocol):
    """The LoRA adapters (Hu et al. 2021): rank r, alpha (scale alpha/r), dropout, target modules, and FFA-LoRA's
    frozen A (Sun et al., ICLR 2024)."""

    r: int
    alpha: float
    dropout: float
    target_modules: object
    freeze_a: bool


class ModelBuild(Protocol):
    """How the model is built: the seed of the LoRA initialisation, gradient checkpointing, base-weight sharding."""

    seed: int
    gradient_checkpointing: bool
    sharding: Sharding


class OptimizerSpec(Protocol):
    """The optimizer over the LoRA tensors: its name, learning rate and weight decay."""

    optimizer: Optimizer
    lr: float
    weight_decay: float


class WarmStartSpec(Protocol):
    """``data.public_warm_start``: the public file and the noise-free fit's steps, records per step and rate."""

    path: str
    steps: int
    batch_size: int
    lr: float


class PublicData(Protocol):
    """A data spec pointed at the public warm-start file (:func:`dplora.data.public.public_data`): no private path.
    The data stage reads it as it reads the private data (record format, columns, chat template)."""

    path: str
    public_warm_start: WarmStartSpec | None

    @property
    def has_eval_set(self) -> bool: ...


class WarmStartBuild(Protocol):
    """What the warm start reads of the run: tokens per record, the seed of its batch order and dropout, and records
    per forward (memory only)."""

    max_seq_len: int
    seed: int

    @property
    def fixed_physical_batch_size(self) -> int: ...
