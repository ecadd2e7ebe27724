"""4-bit NF4 bases (QLoRA, Dettmers et al. 2023) through bitsandbytes: loading, the record's quantization entry and the
checks that a base is really NF4 and not already quantized by someone else."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path

from dplora.contract.choices import Quantization
from dplora.engine.hubkernels import no_hub_kernels
from dplora.engine.specs import ModelSpec
from dplora.errors import BadInputError

# QLoRA's storage (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs"): NF4 weights in blocks
# of 64 with double-quantized block scales. Weights only: activations are never quantized, so no statistic is
# taken across the records of a batch (unlike LLM.int8's outlier columns, refused by the contract).
QUANT_TYPE = "nf4"


DOUBLE_QUANT = True


def bitsandbytes_version() -> str:
    """The installed bitsandbytes version.

    Raises:
        BadInputError: bitsandbytes is not installed (``pip install 'dplora[quant]'``).
    """
    try:
        return importlib.metadata.version("bitsandbytes")
    except importlib.metadata.PackageNotFoundError:
        raise BadInputError("model.quantization=4bit needs bitsandbytes: pip install 'dplora[quant]'") from None


def quantization_entry(section: ModelSpec, dtype: str) -> dict | None:
    """The record's ``base_model.quantization``: None for ``model.quantization: none``, else how the base was stored.

    Args:
        section: The contract's model section.
        dtype: The run's base dtype ("bf16" | "fp32", :func:`resolve_precision`): the 4-bit compute dtype.
    Returns:
        ``{"method": "bitsandbytes", "bits": 4, "quant_type": "nf4", "double_quant": True, "compute_dtype",
        "bitsandbytes_version", "source"}``; ``source`` says that ``base_model.files`` are the unquantized weights.
    Raises:
        BadInputError: bitsandbytes is not installed.
    """
    if Quantization(section.quantization) is Quantization.NONE:
        return None
    return {
        "method": "bitsandbytes",
        "bits": 4,
        "quant_type": QUANT_TYPE,
        "double_quant": DOUBLE_QUANT,
        "compute_dtype": dtype,
        "bitsandbytes_version": bitsandbytes_version(),
        "source": "base_model.files are the unquantized weights, quantized to NF4 when loaded",
    }


def load_4bit(folder: Path, device, dtype: str, attn: str):
    """The causal LM in ``folder`` with its linear layers as bitsandbytes NF4 ``Linear4bit`` on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    config = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=QUANT_TYPE,
        bnb_4bit_use_double_quant=DOUBLE_QUANT,
        bnb_4bit_compute_dtype=torch_dtype,
    )
    return AutoModelForCausalLM.from_pretrained(
        str(folder),
        local_files_only=True,
        quantization_config=config,
        dtype=torch_dtype,
        device_map={"": str(device)},
        attn_implementation=attn,
        **no_hub_kernels(),  # no code from the Hub (dplora.engine.model.quiet_transformers)
    )


def refuse_prequantized(folder: Path, section: ModelSpec) -> None:
    """Refuse a base folder whose config.json already carries a ``quantization_config``: transformers would use the
    folder's own setting (LLM.int8 included) over ``model.quantization``, so the record would misstate the base.

    Raises:
        BadInputError: the folder is already quantized (the message names the folder and its method).
    """
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return  # a .gguf file or no config: the loader reports it
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    if quant:
        method = quant.get("quant_method", "unknown") if isinstance(quant, dict) else "unknown"
        bits = "8-bit" if isinstance(quant, dict) and quant.get("load_in_8bit") else ""
        raise BadInputError(
            f"model at {folder} is already quantized ({method} {bits}".rstrip()
            + "): give the unquantized weights, and model.quantization: 4bit to load them in NF4"
        )


def check_nf4(model) -> None:
    """Every bitsandbytes layer of a 4-bit load is an NF4 ``Linear4bit``; an 8-bit (LLM.int8) layer is refused.

    Raises:
        BadInputError: a layer of another bitsandbytes kind (the sensitivity would no longer be C).
    """
    import bitsandbytes as bnb

    for name, module in model.named_modules():
        kind = type(module).__module__
        if kind.startswith("bitsandbytes") and not isinstance(module, bnb.nn.Linear4bit):
            raise BadInputError(f"model.quantization=4bit loaded {name} as {type(module).__name__}, not NF4 Linear4bit")
        if isinstance(module, bnb.nn.Linear4bit) and getattr(module.weight, "quant_type", QUANT_TYPE) != QUANT_TYPE:
            raise BadInputError(f"model.quantization=4bit loaded {name} as {module.weight.quant_type}, not nf4")
