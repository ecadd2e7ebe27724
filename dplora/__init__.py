"""dplora: differentially private LoRA fine-tuning from a declared privacy contract.

Data flows one way: contract → plan (q, T, σ; no model) → data (units, sampling, tokens) →
engine (model, LoRA, clip, noise, accountant, stop) → release (record, hashes, signature) → audit.
"""

import logging

__version__ = "0.1.0"

# bitsandbytes (imported by peft whenever it is installed) warns at import on every CPU with AVX512-BF16 that an
# optional kernel package is missing, then falls back to its own kernel. It is not actionable for dplora's users
# and it printed on every `dplora train`; only that one message is dropped, its other warnings still show.
_BNB_CPU_KERNEL_NOTICE = "Failed to load CPU gemm_4bit_forward"


def _drop_bnb_cpu_kernel_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_BNB_CPU_KERNEL_NOTICE)


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_drop_bnb_cpu_kernel_notice)
