"""dplora: differentially private LoRA fine-tuning from a declared privacy contract.

Data flows one way: contract → plan (q, T, σ; no model) → data (units, sampling, tokens) →
engine (model, LoRA, clip, noise, accountant, stop) → release (record, hashes, signature) → audit.

From Python (:mod:`dplora.api`, docs/python.md): ``dplora.budget``, ``dplora.train``, ``dplora.verify`` and
``dplora.private_report``; the error classes map one-to-one onto the CLI's exit codes. They are imported on first
use, so ``import dplora`` stays light (no torch).
"""

import logging

from dplora.errors import (
    BadInputError,
    DploraError,
    NotPrivateError,
    PlanRefusedError,
    TrainingFailedError,
    VerificationError,
)

_API = ("budget", "train", "verify", "private_report", "load", "Release", "Verification", "NotCoveredByDP")
__all__ = [
    *_API,
    "BadInputError",
    "DploraError",
    "NotPrivateError",
    "PlanRefusedError",
    "TrainingFailedError",
    "VerificationError",
]


def __getattr__(name: str):
    """The Python API's names, imported on first use (:mod:`dplora.api`).

    The package root is the users' facade, not a stage: no module of dplora imports these names from it, and
    the stage order (tests/test_import_order.py) is kept by importing the API by name here, on first use only.
    """
    if name in _API:
        import importlib

        return getattr(importlib.import_module("dplora.api"), name)
    raise AttributeError(f"module 'dplora' has no attribute {name!r}")


__version__ = "0.1.0"

# bitsandbytes (imported by peft whenever it is installed) warns at import on every CPU with AVX512-BF16 that an
# optional kernel package is missing, then falls back to its own kernel. It is not actionable for dplora's users
# and it printed on every `dplora train`; only that one message is dropped, its other warnings still show.
_BNB_CPU_KERNEL_NOTICE = "Failed to load CPU gemm_4bit_forward"


def _drop_bnb_cpu_kernel_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_BNB_CPU_KERNEL_NOTICE)


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_drop_bnb_cpu_kernel_notice)

# Offline (HF_HUB_OFFLINE=1, as a CI runner without network should be), the `kernels` package that bitsandbytes
# loads warns on every model-loading command that it skips the publisher trust check of its cached kernel: a second
# line under every one-line refusal, not actionable (dplora itself keeps Hub kernels off, dplora.engine.hubkernels).
_KERNELS_OFFLINE_NOTICE = "Skipping publisher trust check for "


def _drop_kernels_offline_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_KERNELS_OFFLINE_NOTICE)


logging.getLogger("kernels._internals.hf_hub").addFilter(_drop_kernels_offline_notice)
