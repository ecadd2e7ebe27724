"""The contract's choices: one enum per choice a contract makes (what is protected, how units are clipped, where
per-record gradients come from, precision, quantization, schedules, optimisers, trackers, attention kernels).

Leaf module: imports nothing of dplora, so every stage may name a choice without importing the contract's models.
"""

from __future__ import annotations

import enum


class ProtectedUnit(str, enum.Enum):
    """What one privacy unit is: a data row, a whole ticket, or a whole customer."""

    ROW = "row"
    TICKET = "ticket"
    USER = "user"


class UnitClipping(str, enum.Enum):
    """How a unit's vector is built from its records' gradients before the clip (Charles et al. 2024)."""

    SUM = "sum"
    MEAN = "mean"


class PerSamplePath(str, enum.Enum):
    """Where per-record gradients come from (same clipping, noise and accounting either way): ``fast`` writes every
    LoRA layer's per-example gradients into one buffer; ``opacus`` uses Opacus hooks, the reference path."""

    FAST = "fast"
    OPACUS = "opacus"


class AttnImplementation(str, enum.Enum):
    """The attention kernel transformers uses (``attn_implementation`` of ``from_pretrained``; performance only):
    ``auto`` is sdpa where the architecture supports it, else eager (resolved when the model loads, recorded as
    resolved); ``flash_attention_2`` needs the ``flash_attn`` package."""

    AUTO = "auto"
    SDPA = "sdpa"
    EAGER = "eager"
    FLASH_ATTENTION_2 = "flash_attention_2"


class ReportTo(str, enum.Enum):
    """Experiment tracker for the plan's public numbers (dplora.run.tracking); ``none`` writes none."""

    NONE = "none"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"
    TRACKIO = "trackio"


class Clipping(str, enum.Enum):
    """What is done to each unit's summed vector g before noise: ``clip`` g·min(1, C/‖g‖) (Abadi et al. 2016);
    ``normalize`` C·g/(‖g‖ + γ) with the fixed public γ = NORMALIZE_GAMMA·C (automatic clipping, Bu et al. 2023;
    Yang et al. 2022). Either way every unit contributes norm ≤ C (normalize: < C), so σ·C noise covers it."""

    CLIP = "clip"
    NORMALIZE = "normalize"


class LrSchedule(str, enum.Enum):
    """Learning-rate schedule over the T logical steps (data-independent: post-processing, no privacy effect)."""

    CONSTANT = "constant"
    LINEAR = "linear"
    COSINE = "cosine"


class Optimizer(str, enum.Enum):
    """The torch optimiser that consumes the noised, normalised gradient (post-processing: no privacy effect)."""

    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"
    DP_ADAMBC = "dp_adambc"  # Adam with the DP noise variance removed from its second moment (dplora.mechanism.adambc)


class Precision(str, enum.Enum):
    """Dtype of the frozen base weights. LoRA parameters, per-example gradients, clipping, noise and the optimiser
    state stay fp32 in every mode. ``auto``: bf16 on a GPU that supports it, fp32 on CPU."""

    AUTO = "auto"
    BF16 = "bf16"
    FP32 = "fp32"


class Quantization(str, enum.Enum):
    """How the frozen base weights are stored. ``4bit``: bitsandbytes NF4 with double quantization (QLoRA,
    Dettmers et al. 2023), computed in the run's base dtype; weights only, so each record's activations and
    gradients stay its own. ``8bit`` (LLM.int8) is refused: see :data:`INT8_REFUSAL`."""

    NONE = "none"
    FOUR_BIT = "4bit"
    EIGHT_BIT = "8bit"


class Sharding(str, enum.Enum):
    """How the frozen base weights are placed over the run's W processes (performance and memory only; the
    mechanism is the same). ``none``: every rank holds the whole base (data parallel). ``fsdp``: torch FSDP2
    (``fully_shard``) holds each decoder layer's and the root's base weights 1/W per rank and all-gathers them per
    forward; the LoRA tensors stay whole on every rank (see docs/multi-gpu.md)."""

    NONE = "none"
    FSDP = "fsdp"
