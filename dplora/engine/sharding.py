"""The frozen base model sharded over the run's W processes (``training.sharding: fsdp``): torch FSDP2.

The mechanism does not change: each rank computes its own units' per-example LoRA gradients, clips them per unit
and joins the step's one all-reduce (:mod:`dplora.mechanism.reduction`), where rank 0's single draw of σC noise is
added. Only where the BASE weights live changes:

- **Sharded base.** Every decoder layer (the model's ``_no_split_modules`` classes) and then the root are wrapped
  by ``torch.distributed.fsdp.fully_shard`` over a 1-D device mesh of the W ranks, so each rank holds dim-0
  chunk ``rank`` of every base tensor (``torch.chunk`` over W: about 1/W of the parameters) and all-gathers a
  layer's weights for its forward and again for its backward.
- **No full copy per rank.** The model is built on the meta device (``accelerate.init_empty_weights``; buffers such
  as rotary frequencies are real), sharded, materialised empty, and each rank reads its chunk of every tensor from
  the model folder's safetensors files, one tensor at a time (memory-mapped): the peak is the local shards plus
  one full tensor.
- **LoRA whole on every rank.** peft wraps the sharded model afterwards, so the LoRA tensors are ordinary
  parameters outside FSDP's groups: FSDP never reduces their gradients (its reduce-scatter would sum UNCLIPPED
  gradients) and the fast per-example path writes them as in one process. LoRA is about 0.1-1 % of the base, so
  replicating it costs little and keeps the clipped-sum reduction, the noise draw and the optimizer unchanged.
- **Same forwards on every rank.** Every FSDP forward and backward is collective, so a rank with fewer physical
  batches in a logical step runs padding forwards whose per-example rows are discarded
  (:func:`dplora.mechanism.reduction.common_forward_count`, :mod:`dplora.run.loop`).

Source: PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``, "Getting started with FSDP2"); torchtune's
``lora_finetune_distributed`` recipe (meta-device init, sharded load, LoRA in the same model).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dplora.engine import distributed
from dplora.engine.specs import ModelSpec
from dplora.errors import BadInputError, TrainingFailedError

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
DESCRIPTION = (
    "torch FSDP2 fully_shard of every decoder layer and the root over the W ranks: each rank holds dim-0 chunk "
    "'rank' of every frozen base tensor and all-gathers a layer per forward; the LoRA tensors stay whole on every "
    "rank, outside FSDP (their gradients are never reduced by FSDP)"
)


def weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name → the safetensors file that holds it, from ``model.safetensors`` or its index.

    Raises:
        BadInputError: the folder has no safetensors weights (a .bin-only or .gguf model cannot be loaded sharded).
    """
    index = folder / WEIGHTS_INDEX
    if index.is_file():
        mapping = json.loads(index.read_text())["weight_map"]
        return {name: folder / file for name, file in mapping.items()}
    single = folder / WEIGHTS
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as fh:
            return dict.fromkeys(fh.keys(), single)
    raise BadInputError(
        f"training.sharding=fsdp reads each rank's shard from safetensors files: {folder} has no {WEIGHTS} or "
        f"{WEIGHTS_INDEX}"
    )


def decoder_layers(model) -> list[torch.nn.Module]:
    """The model's decoder layers (the classes transformers never splits, ``_no_split_modules``), in order.

    Raises:
        BadInputError: the architecture names no such class (FSDP would then hold the whole base in one group).
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise BadInputError(
            f"training.sharding=fsdp: {type(model).__name__} names no decoder layer class (_no_split_modules)"
        )
    return layers


def local_chunk(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's dim-0 chunk of ``full`` as FSDP2 shards it (``torch.chunk`` over W; empty past the last chunk)."""
    chunks = torch.chunk(full, world_size, dim=0)
    return chunks[rank] if rank < len(chunks) else full[:0]


def load_sharded_base(section: ModelSpec, device, dtype: str, allow_tf32: bool, world, log=print):
    """The frozen base model sharded 1/W per rank (see module docstring) and its tokenizer.

    Args:
        section: the contract's model section (a Hugging Face folder with safetensors weights, or the packaged
            model, converted once to such a folder).
        device: this rank's device; dtype: base weights "bf16" | "fp32"; allow_tf32: TF32 for fp32 matmuls (CUDA).
        world: the run's processes (:class:`dplora.engine.distributed.World`); W = 1 gives one full shard.

    Returns:
        (model, tokenizer): every base parameter a DTensor sharded on dim 0 over the W ranks, frozen; the tokenizer
        has a pad token.

    Raises:
        BadInputError: a .gguf file, a folder without safetensors, an architecture without decoder layer classes,
            or a tensor the folder lacks.
    """
    from accelerate import init_empty_weights
    from safetensors import safe_open
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from dplora.engine.model import load_error, quiet_transformers, resolve_attn_implementation, resolve_model

    folder, gguf = resolve_model(section, log)
    if gguf:
        raise BadInputError(
            "training.sharding=fsdp needs a Hugging Face folder with safetensors weights, not a .gguf file"
        )
    files = weight_files(folder)
    quiet_transformers()
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    attn = resolve_attn_implementation(section, folder, None)
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        with init_empty_weights(include_buffers=False):  # parameters on meta; buffers (rotary) real
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch_dtype)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise load_error(folder, err) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.requires_grad_(False)
    distributed.ensure_process_group(world, device)
    mesh = init_device_mesh(torch.device(device).type, (world.world_size,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
        _load_local_shards(model, files, world, safe_open)
    if torch.device(device).type == "cuda":  # as dplora.engine.model.place_model
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        torch.backends.cudnn.allow_tf32 = allow_tf32
    return model, tokenizer


def _load_local_shards(model, files: dict[str, Path], world, safe_open) -> None:
    """Copy this rank's chunk of every parameter from the safetensors files (one full tensor in memory at a time).

    Raises:
        BadInputError: a parameter the files lack (tied output weights are one parameter, loaded once).
        TrainingFailedError: a chunk whose shape differs from FSDP's local shard.
    """
    handles: dict[Path, object] = {}
    try:
        for name, param in model.named_parameters():
            path = files.get(name)
            if path is None:
                raise BadInputError(f"training.sharding=fsdp: the model folder has no tensor {name}")
            if path not in handles:
                handles[path] = safe_open(str(path), framework="pt").__enter__()
            local = param.to_local() if hasattr(param, "to_local") else param
            part = local_chunk(handles[path].get_tensor(name), world.rank, world.world_size)
            if tuple(part.shape) != tuple(local.shape):
                raise TrainingFailedError(
                    f"training.sharding=fsdp: {name}'s chunk {tuple(part.shape)} is not the local shard "
                    f"{tuple(local.shape)}"
                )
            local.copy_(part.to(dtype=local.dtype))
    finally:
        for fh in handles.values():
            fh.__exit__(None, None, None)


def local_base_parameters(model) -> tuple[int, int]:
    """(base parameters this rank holds, base parameters in all): local DTensor shards counted, LoRA excluded.

    Without sharding both numbers are equal (every frozen tensor is whole on the rank).
    """
    held = total = 0
    for name, p in model.named_parameters():
        if p.requires_grad or ".lora_" in name:  # LoRA tensors (a frozen FFA-LoRA A too) are not the base
            continue
        total += p.numel()
        held += p.to_local().numel() if hasattr(p, "to_local") else p.numel()
    return held, total


def local_rows(weight) -> tuple[int, torch.Tensor]:
    """(first row index, local rows) of a dim-0 sharded DTensor on this rank (``torch.chunk`` rows per rank)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = -(-weight.shape[0] // world)
    return rank * per_rank, weight.to_local()
