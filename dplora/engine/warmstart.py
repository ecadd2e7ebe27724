"""The public warm start (``data.public_warm_start``): the LoRA adapter fitted WITHOUT noise on a public file, then
handed to the DP phase as its starting point.

Public pretraining then private fine-tuning is the standard way to buy utility back under DP: Li, Tramèr, Liang and
Hashimoto (ICLR 2022), "Large language models can be strong differentially private learners", and Yu et al. (ICLR
2022), "Differentially private fine-tuning of language models", start DP fine-tuning from weights trained on public
data only; here the public phase also fits the adapter itself (the utility study in docs/utility.md measures
by how much).

What it does, in order (:func:`warm_start`):

1. The caller points the contract's data section at the public file (:func:`dplora.data.public.public_data`: same
   record format, columns and chat template; no held-out set, labels or groups) and passes only that: the private
   ``data.path`` never reaches :func:`warm_start`.
2. The file is hashed (sha256, before and after it is read: a file that changes while read is refused), loaded with
   :func:`dplora.data.units.load_table` and tokenized by :func:`dplora.data.tokens.encode_records` exactly as the
   private records are (``training.max_seq_len``, the model's chat template, the loss mask).
3. ``steps`` optimizer steps of plain AdamW (β 0.9/0.999, ε 1e-8, weight decay 0) at ``lr`` on the trainable LoRA
   tensors; each step's loss is the mean token cross entropy over the target tokens of ``batch_size`` public records
   (nats per token), accumulated over chunks of ``training.physical_batch_size`` records (memory only). The batches
   are consecutive slices of seeded permutations of the records (one permutation per pass, numpy's PCG64 keyed by
   ``training.seed``), and LoRA dropout draws from torch's generator seeded with the same seed inside a forked RNG
   state: the warm start is a deterministic function of the contract, the public file and the initial adapter.
4. The optimizer and its state are discarded, gradients are cleared: the DP phase starts from these adapter
   weights exactly as it would start from peft's initialisation.

No clipping and no noise: nothing here is a DP mechanism, and nothing here is charged. It never opens the private
file and runs before any private record is sampled (:func:`dplora.recipe.build.build_run` calls it after the model
and the private tokens are loaded, before the DP engine is built); a resumed run does not run it again (its
checkpoint holds the adapters and the record's entry). With W processes every rank computes it on the same batches
(no rank waits on another's forward), and rank 0's adapters are broadcast with the rest of its state
(:func:`dplora.engine.distributed.sync_state`), so rank 0's warm start is what every rank starts from.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from dplora.engine.specs import PublicData, WarmStartBuild
from dplora.errors import BadInputError, excerpt

KEY = "data.public_warm_start"
# The batch order's seed-sequence words: (training.seed, this tag), a stream apart from every other seeded draw.
ORDER_TAG = 0x7A57_5741
OPTIMIZER_WORDS = (
    "AdamW (betas 0.9, 0.999; eps 1e-8; weight decay 0) on the mean token cross entropy of each batch of public "
    "records; no clipping, no noise; its state is discarded before the DP phase"
)
STATEMENT = (
    "the adapter was first fitted without noise on this file, which the contract declares public; no privacy budget "
    "is charged for it because it never sees the private data. Declaring private data public voids the guarantee"
)


def batch_order(num_records: int, steps: int, batch_size: int, seed: int) -> np.ndarray:
    """Record indices of every warm-start step, shape (steps, batch_size), int64.

    Consecutive slices of seeded permutations of ``range(num_records)`` (a new permutation per pass), so every
    record is used once per pass and the order is a function of ``seed`` alone.

    Raises:
        ValueError: ``num_records`` < 1.
    """
    if num_records < 1:
        raise ValueError("no records to order")
    rng = np.random.default_rng([int(seed) & (2**63 - 1), ORDER_TAG])
    need = steps * batch_size
    passes = -(-need // num_records)
    order = np.concatenate([rng.permutation(num_records) for _ in range(passes)])[:need]
    return order.reshape(steps, batch_size).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class PublicExamples:
    """The public file, tokenized: (input_ids, labels) per record, and the file's sha256 (hex)."""

    examples: list[tuple[list[int], list[int]]]
    sha256: str


def load_public_examples(public: PublicData, tokenizer, *, max_seq_len: int) -> PublicExamples:
    """Hash, read and tokenize the public file of ``public`` (:func:`dplora.data.public.public_data`) as training
    tokenizes records.

    Raises:
        BadInputError: the file cannot be read, changes while it is read, lacks a column, or has no record with a
            target token left after truncation to ``max_seq_len`` (each one line naming ``data.public_warm_start``).
    """
    from dplora.data import units as data_mod
    from dplora.data.digest import sha256_file
    from dplora.data.tokens import encode_records

    path = Path(public.path)
    where = f"{KEY}.path={excerpt(str(path), 200)}"
    try:
        before = sha256_file(path)
        table = data_mod.load_table(public, unit_key=None)
        after = sha256_file(path)
    except OSError as err:
        raise BadInputError(f"{where}: cannot read it ({err.strerror or err.__class__.__name__})") from None
    except BadInputError as err:
        raise BadInputError(f"{where}: {err}") from None
    if before != after:
        raise BadInputError(f"{where}: the file changed while it was read; keep the public file fixed during a run")
    examples, _ = encode_records(table, tokenizer, public, max_seq_len=max_seq_len)
    if not any(any(label != -100 for label in labels[1:]) for _, labels in examples):
        raise BadInputError(f"{where}: no public record keeps a target token within training.max_seq_len={max_seq_len}")
    return PublicExamples(examples=examples, sha256=before)


def _token_loss_sum(model, batch) -> object:
    """Sum of the token cross entropies over the target tokens of ``batch`` (nats), a 0-d tensor."""
    import torch.nn.functional as F

    from dplora.engine.batch import IGNORE_INDEX

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits, targets = logits[:, :-1, :], batch["labels"][:, 1:]
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def fit(
    model,
    examples: list[tuple[list[int], list[int]]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    pad_id: int,
    physical: int,
    device,
) -> list[float]:
    """``steps`` non-private AdamW steps on ``model``'s trainable tensors over ``examples`` (see the module).

    Args:
        model: the peft model in train mode (LoRA tensors trainable, fp32), not yet wrapped for per-example
            gradients.
        examples: public (input_ids, labels) pairs; labels −100 off target.
        steps, batch_size, lr: ``data.public_warm_start``'s steps, records per step and learning rate.
        seed: ``training.seed`` (batch order and dropout).
        pad_id: the tokenizer's pad id; physical: records per forward (memory only); device: the model's device.

    Returns:
        Each step's mean token loss on its public batch (nats per target token), ``steps`` floats.
    """
    import torch

    from dplora.engine.batch import IGNORE_INDEX, collate

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    order = batch_order(len(examples), steps, batch_size, seed)
    losses: list[float] = []
    cuda = [device] if getattr(device, "type", str(device)) == "cuda" else []
    with torch.random.fork_rng(devices=cuda):  # dropout seeded here; the OS-entropy state comes back afterwards
        torch.manual_seed(seed)
        for rows in order:
            chosen = [examples[i] for i in rows]
            targets = sum(sum(1 for label in labels[1:] if label != IGNORE_INDEX) for _, labels in chosen)
            denominator = float(max(targets, 1))
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for start in range(0, len(chosen), physical):
                batch = collate(chosen[start : start + physical], pad_id, device)
                loss = _token_loss_sum(model, batch) / denominator
                loss.backward()
                total += float(loss.detach())
            optimizer.step()
            losses.append(total)
    optimizer.zero_grad(set_to_none=True)
    optimizer.state.clear()  # nothing of the public phase's optimizer survives into the DP phase
    del optimizer
    for p in params:
        p.grad = None
    model.train()
    return losses


def warm_start(public: PublicData, training: WarmStartBuild, model, tokenizer, *, log=print) -> dict:
    """Fit ``model``'s LoRA adapter on the contract's public file (``data.public_warm_start``); see the module.

    Args:
        public: :func:`dplora.data.public.public_data` of the contract's data section (its ``path`` is the public
            file, its ``public_warm_start`` the settings): no private path reaches this function.
        training: ``max_seq_len``, ``seed`` and ``fixed_physical_batch_size`` (the run's config, or the contract's
            training section).
        model: the peft model from :func:`dplora.engine.lora.setup_model`, before the DP engine wraps it.
        tokenizer: the model's tokenizer.
        log: the public log (one line: the public file, the settings and the public loss before and after).

    Returns:
        The release record's ``public_warm_start`` entry: ``path`` (as in the contract), ``file``, ``sha256`` (of
        the public file), ``records``, ``steps``, ``batch_size``, ``lr``, ``optimizer``, ``batch_order``,
        ``epsilon_charged`` (0) and ``statement``. Public: a function of the contract and the public file.

    Raises:
        BadInputError: the public file cannot be used (:func:`load_public_examples`).
        ValueError: ``public`` is not a :func:`dplora.data.public.public_data` section (no settings, or a path that
            is not the public file's).
    """
    from dplora.engine import runtime

    warm = public.public_warm_start
    if warm is None or public.path != warm.path or public.has_eval_set:
        raise ValueError("warm_start takes public_data(data): the data section pointed at the public file")
    loaded = load_public_examples(public, tokenizer, max_seq_len=training.max_seq_len)
    losses = fit(
        model,
        loaded.examples,
        steps=warm.steps,
        batch_size=warm.batch_size,
        lr=warm.lr,
        seed=training.seed,
        pad_id=tokenizer.pad_token_id,
        physical=training.fixed_physical_batch_size,
        device=runtime.parameter_device(model),
    )
    name = Path(warm.path).name
    log(
        f"public warm start: {warm.steps} steps of {warm.batch_size} records from {name} (declared public; AdamW "
        f"lr {warm.lr:g}, no clipping, no noise, no ε charged); public loss {losses[0]:.4f} → {losses[-1]:.4f}"
    )
    return {
        "path": warm.path,
        "file": name,
        "sha256": loaded.sha256,
        "records": len(loaded.examples),
        "steps": warm.steps,
        "batch_size": warm.batch_size,
        "lr": warm.lr,
        "optimizer": OPTIMIZER_WORDS,
        "batch_order": "seeded permutations of the public records under the record's seed (training.seed)",
        "epsilon_charged": 0,
        "statement": STATEMENT,
    }
