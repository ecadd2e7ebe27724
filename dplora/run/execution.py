"""What a run records about how it executed (public, performance only) and when: shared by the run's checkpoints
and the recipe's release record, so it sits in the run stage, below both.
"""

from __future__ import annotations

import datetime as dt

from dplora.engine.distributed import execution_entry as world_entry


def utc_now() -> str:
    """The current UTC time as ISO 8601 to the second (``2026-12-01T20:31:53+00:00``), for records and checkpoints."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def execution_entry(spec, *, reducer=None, ranks=None) -> dict:
    """How the run executed (public, performance only): device type, base dtype, TF32, the noise generator,
    the world size and launcher (with W processes: backend, sharding, noise draws, each rank's steps and digest),
    and the memory settings of :func:`memory_entry`.
    """
    from dplora.mechanism.optimizer import noise_generator_name  # torch: imported only when a run records its execution

    return {
        "device_type": spec.device.type,
        "base_dtype": spec.dtype,
        "lora_dtype": "fp32",
        "dp_arithmetic_dtype": "fp32 (per-sample gradients, norms, clipping, noise, optimizer state)",
        "allow_tf32": spec.allow_tf32,
        "noise_generator": noise_generator_name(spec.device),
        **memory_entry(spec),
        **sharding_entry(spec),
        "noise_floating_point_note": FLOATING_POINT_NOTE,
        **world_entry(spec.world, getattr(reducer, "noise_draws", None), ranks),
    }


def memory_entry(spec) -> dict:
    """The memory settings (public; none changes the privacy event): the attention kernel as resolved for the model
    (``spec.attn_implementation``: ``auto`` as sdpa or eager, :func:`dplora.engine.model.resolve_attn_implementation`),
    gradient checkpointing,
    and the physical batch with where it came from. ``auto`` is probed on synthetic batches of ``max_seq_len``
    tokens before step 1, so the value depends on the model, device and contract, never on the data; a smaller batch
    after an out-of-memory retry mid-run is data-dependent and is not recorded.
    """
    flags = spec.config.flags
    if flags.physical_batch_size != "auto":
        source = "contract"
    elif spec.device.type == "cuda":
        source = "auto: probed on synthetic batches of max_seq_len tokens (halved on out-of-memory)"
    else:
        source = "auto: the CPU default"
    return {
        "attn_implementation": getattr(spec, "attn_implementation", None) or flags.attn_implementation.value,
        "gradient_checkpointing": "non-reentrant" if flags.gradient_checkpointing else "off",
        "physical_batch_size": spec.physical_batch_size,
        "physical_batch_source": source,
    }


def sharding_entry(spec) -> dict:
    """Where the base weights lived (public; no choice of it changes the privacy event): ``base_sharding`` is the
    contract's ``training.sharding`` (``none`` | ``fsdp``), with how FSDP placed them for ``fsdp``."""
    sharding = spec.config.flags.sharding.value
    if sharding == "none":
        return {"base_sharding": sharding}
    from dplora.engine.sharding import DESCRIPTION

    return {"base_sharding": sharding, "base_sharding_detail": DESCRIPTION}


FLOATING_POINT_NOTE = (
    "the Gaussian noise is sampled in floating point (Box-Muller in fp64, four draws summed as Opacus secure_mode, "
    "rounded to fp32); the accountant assumes an ideal real-valued Gaussian, and floating-point samplers can deviate "
    "from it in the low-order bits (Mironov 2012; Holohan & Braghin 2021): the guarantee holds for the ideal "
    "mechanism, as in Opacus and every DP-SGD library"
)
