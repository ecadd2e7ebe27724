"""How a run is computed, never what it computes: :class:`PerformanceFlags` (a leaf with no torch, so that the
commands that only plan can name it)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from dplora.contract.choices import AttnImplementation, PerSamplePath, Precision, Sharding


@dataclasses.dataclass(frozen=True, kw_only=True)
class PerformanceFlags:
    """How the run is computed, never what it computes: every value gives the same DP event, plan and guarantee
    (jax_privacy's ``PerformanceFlags``, kept apart from the mechanism for the same reason).

    Attributes:
        per_sample: the per-example path (``fast`` or ``opacus``); both give the same rows (tests/engine/
            test_fastclip.py checks them against a one-record-at-a-time backward).
        physical_batch_size: records per forward, or ``"auto"`` (probed on synthetic batches before step 1).
        gradient_checkpointing: recompute activations in the backward (non-reentrant), for memory.
        sharding: where the base weights live (``none``, or ``fsdp`` over the ranks).
        threads: CPU threads (None: the cores free when the run starts).
        dtype: the base weights' precision (``auto`` resolved per device at load; LoRA and DP arithmetic are fp32).
        attn_implementation: the attention kernel (``auto`` resolved per model at load).
        checkpoint_every: logical steps between resume checkpoints (None: about every ten minutes of work).
    """

    per_sample: PerSamplePath = PerSamplePath.FAST
    physical_batch_size: int | Literal["auto"] = 8
    gradient_checkpointing: bool = False
    sharding: Sharding = Sharding.NONE
    threads: int | None = None
    dtype: Precision = Precision.AUTO
    attn_implementation: AttnImplementation = AttnImplementation.AUTO
    checkpoint_every: int | None = None

    @property
    def fixed_physical_batch_size(self) -> int:
        """``physical_batch_size`` as a number: ``auto`` reads as 8, the CPU default."""
        return 8 if self.physical_batch_size == "auto" else self.physical_batch_size
