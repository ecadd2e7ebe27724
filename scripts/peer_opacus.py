"""The peer row of the utility study (issue 43): the field's default recipe, plain Opacus + peft, on the study's work.

How far is the recipe most teams would copy from dplora's rows on the same data, budget and evaluation? This script
trains LoRA adapters with **plain Opacus 1.6 and peft**, written the way Opacus's own LoRA tutorial does it, and
scores them exactly as ``scripts/utility_bench.py --study`` scores a dplora row.

**The tutorial followed.** Opacus, "Building a text classifier with Differential Privacy", section "Low-Rank
Adaptation (LoRA) with DP-SGD": https://github.com/pytorch/opacus/blob/main/tutorials/building_text_classifier.ipynb
(rendered at https://opacus.ai/tutorials/building_text_classifier; the LoRA section as last changed by pytorch/opacus
commit 0a70a1d, 2025-02-25, "Small changes to Lora+DP-SGD tutorial (#733)"). Its recipe, kept here (:data:`RECIPE`):

- ``torch.optim.AdamW(model.parameters(), lr=5e-4, eps=1e-8)`` (torch's defaults otherwise: betas 0.9/0.999,
  weight decay 0.01), ``max_grad_norm`` (C) 0.1, ``BATCH_SIZE`` 32 (the DataLoader's batch size, which Opacus
  turns into the expected batch size and q = 1/len(loader)), 3 epochs;
- ``LoraConfig(r=32, lora_alpha=32, lora_dropout=0.05)`` with peft's default target modules for the architecture
  (BERT's query/value there; q_proj/v_proj for SmolLM2's Llama), then every layer but the LAST transformer layer
  frozen (``model.base_model.bert.encoder.layer[:-1]`` there; the last decoder layer here), so only the last
  layer's LoRA matrices train;
- ``privacy_engine.make_private_with_epsilon(..., criterion=nn.CrossEntropyLoss(reduction="mean"),
  grad_sample_mode="ghost")`` (ghost clipping), the loss taken from the logits through Opacus's wrapped criterion,
  ``optimizer.zero_grad(); loss.backward(); optimizer.step()`` once per batch of the returned data loader, for the
  epochs; the adapter at the end is the one scored (no selection).

**What is ours instead of the tutorial's** (the study's fixed work, so that only the recipe differs):

- **Poisson sampling**, explicitly (``poisson_sampling=True``: Opacus's ``DPDataLoader``, each record in each batch
  independently with q = 1/len(loader)). The tutorial gets it by default from ``make_private`` too, but its FSDP
  Llama example turns it off; without it the accountant's ε is not valid for the run (issue 49).
- ε = 8, δ = 1e-5 (the tutorial: ε 7.5, δ = 1/len(train_dataloader), i.e. one over the number of batches),
  accountant ``PrivacyEngine(accountant="prv")`` (Opacus's default; the tutorial does not name one).
- The study's data: the first 1,600 Bitext training rows (``utility_bench.bitext_data`` of the ``--cpu`` preset),
  read as dplora reads them (``dplora.data.units.load_table``) and tokenized by dplora's tokenizer path
  (``dplora.data.tokens.tokenize_records``): the model's chat template, targets on the assistant turn only (−100
  elsewhere), 64 tokens; right-padded to 64 tokens (the tutorial pads every example to its max length too) with
  padding masked (label −100, attention mask 0). The model: the packaged SmolLM2-135M-Instruct in fp32, loaded
  as dplora loads it (same weights and tokenizer).
- The task: a causal LM (``TaskType.CAUSAL_LM``; the tutorial classifies with ``SEQ_CLS``, whose new classifier
  head also trains there; here nothing but the last layer's LoRA matrices trains). The tutorial's criterion gets
  one label per example; for a causal LM the same criterion gets the shifted logits and targets flattened with
  ``shape=(B, T, V)``, and Opacus 1.6 reduces it to ONE loss per sequence: the mean cross entropy over the
  sequence's real target tokens (``ignore_index`` −100 out of sum and count; the target passed positionally,
  since a keyword target skips that handling). That is the per-sequence loss dplora trains with
  (``dplora.engine.batch.per_sequence_loss``), not the model's ``labels=`` loss, which is one token mean over
  the whole batch and couples the examples' gradients; the tutorial's causal-LM analogue would pass ``labels=``
  to the model, which we do not (it would only add an unused loss).
- The evaluation: ``utility_bench``'s Scorer, ``bitext_eval`` and ``bitext_validation``: loss per target token on
  the 100 held-out conversations and on the 200 validation conversations, base and adapter, the share on the
  study's fixed base and control (``utility_bench.study_share``). The row has the study's keys and is appended by
  ``utility_bench.write_study`` (``docs/utility-study.json`` and the table in ``docs/utility.md``).
- A seed (``--seed``, default 0) for torch's global generator, which the tutorial leaves at torch's fixed default:
  LoRA's init, dropout, the Poisson draws and the noise all come from it.

**What differs from dplora's rows, besides the hyper-parameters** (say so wherever the row is quoted):

- Record-level sampling and clipping only: one record is one privacy unit (the study's rows are row-level too,
  so the ε compare like for like); Opacus has no unit-level (user-level) sampling or clipping.
- No signed release record, no budget ledger, no verify: the adapter is a plain peft folder.
- The randomness is torch's mt19937, seeded (``secure_mode=False``, the tutorial's default), not a cryptographic
  source: fine for a utility comparison, not for a release (dplora draws its noise from a ChaCha20 stream keyed
  from ``os.urandom`` and its Poisson batches from OS entropy, ``dplora.mechanism``).
- An empty Poisson batch cannot go through a Llama forward; the step then still runs on zero per-record
  gradients (noise added, accountant stepped), as Opacus's optimizer does for B = 0. At q = 0.02 and N = 1,600
  its probability is 0.98^1600 ≈ 1e-14 per step.
- ``--max-steps K`` stops after K steps (smoke runs): σ stays calibrated for the full 3 epochs and ε spent is the
  accountant's for the K steps taken.

Usage::

    .venv/bin/python scripts/peer_opacus.py --threads 1 --out runs/peer        # the real row (--cpu preset)
    .venv/bin/python scripts/peer_opacus.py --toy --out /tmp/peer               # tiny random chat model: seconds
    .venv/bin/python scripts/peer_opacus.py --max-steps 2 --out /tmp/p          # a smoke run of the real model

The real row: T = 150 steps (3 epochs at q = 0.02). A 2-step smoke run on one thread (the other core busy) took
28 s for 81 records (0.35 s per record), so about 150 · 32 · 0.35 s ≈ 28 min of training, plus about 3 min of
loading and scoring (base and adapter on 300 conversations; estimated from the study's dplora rows, not measured).

Writes ``OUT/runs/peer-opacus/adapter`` and appends the row to ``--study-json``/``--study-md`` (defaults:
``docs/utility-study.json`` and ``docs/utility.md``; with ``--toy`` or ``--max-steps``: ``OUT/utility-study.json``
and ``OUT/utility.md``), and prints the row.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SOURCE = (
    "Opacus tutorial 'Building a text classifier with Differential Privacy', section 'Low-Rank Adaptation (LoRA) "
    "with DP-SGD': https://github.com/pytorch/opacus/blob/main/tutorials/building_text_classifier.ipynb "
    "(pytorch/opacus commit 0a70a1d, #733)"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
    """The Opacus LoRA tutorial's hyper-parameters (see the module docstring for where each comes from)."""

    lr: float = 5e-4
    adam_eps: float = 1e-8
    max_grad_norm: float = 0.1
    batch_size: int = 32
    epochs: int = 3
    lora_r: int = 32
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    grad_sample_mode: str = "ghost"
    last_layer_only: bool = True  # the tutorial freezes every transformer layer but the last


RECIPE = Recipe()
EPSILON = 8.0  # the study's target ε (the tutorial: 7.5)
ACCOUNTANT = "prv"  # the study's accountant (the --cpu preset's), also on the toy (TOY_FULL's rows use RDP)
CHANGES = (
    "peer: plain Opacus 1.6 + peft, the Opacus LoRA tutorial's recipe (AdamW lr 5e-4, C 0.1, B 32, E 3, LoRA r 32 "
    "α 32 dropout 0.05 on q,v of the last layer only, ghost clipping) with Poisson sampling, ε 8, δ 1e-5, PRV"
)


def bench_module():
    """``scripts/utility_bench.py`` as a module (its data, scoring, presets and the study's writer)."""
    if "utility_bench" in sys.modules:
        return sys.modules["utility_bench"]
    spec = importlib.util.spec_from_file_location("utility_bench", ROOT / "scripts" / "utility_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["utility_bench"] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def decoder_layers(model):
    """The model's stack of transformer layers (the longest ``ModuleList`` whose name ends in ``layers``)."""
    import torch

    stacks = [m for n, m in model.named_modules() if n.endswith("layers") and isinstance(m, torch.nn.ModuleList)]
    if not stacks:
        raise ValueError("no transformer layer stack (a ModuleList named *layers) in the model")
    return max(stacks, key=len)


def lora_model(base, recipe: Recipe = RECIPE):
    """The tutorial's LoRA: ``get_peft_model`` with r, alpha and dropout and peft's default targets, then every
    transformer layer but the last frozen (when ``recipe.last_layer_only``).

    Returns:
        (peft model, its resolved target module names, trained parameter count).
    """
    from peft import LoraConfig, TaskType, get_peft_model

    config = LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        inference_mode=False,
        r=recipe.lora_r,
        lora_alpha=recipe.lora_alpha,
        lora_dropout=recipe.lora_dropout,
    )
    model = get_peft_model(base, config)
    if recipe.last_layer_only:
        for p in decoder_layers(model)[:-1].parameters():
            p.requires_grad = False
    targets = sorted(model.peft_config["default"].target_modules)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return model, targets, trained


def padded_dataset(examples: list[tuple[list[int], list[int]]], pad_id: int, width: int):
    """(input_ids, labels) pairs right-padded to ``width`` tokens as a ``TensorDataset`` of (input_ids,
    attention_mask, labels); padding has attention 0 and label −100."""
    import torch
    from torch.utils.data import TensorDataset

    from dplora.engine.batch import IGNORE_INDEX

    n = len(examples)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
    for i, (x, y) in enumerate(examples):
        if len(x) > width:
            raise ValueError(f"example {i} has {len(x)} tokens, more than the width {width}")
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
        labels[i, : len(y)] = torch.tensor(y)
    return TensorDataset(ids, mask, labels)


def batch_loss(model, criterion, batch, device="cpu"):
    """The tutorial's ``loss = criterion(outputs.logits, labels)`` for a causal LM: the shifted logits and targets
    flattened, ``shape`` given so that Opacus's ghost criterion reduces them to one mean per sequence over its real
    target tokens (targets positional: a keyword target skips Opacus's ignore-index handling)."""
    ids, mask, labels = (t.to(device) for t in batch)
    logits = model(input_ids=ids, attention_mask=mask).logits
    logits, targets = logits[:, :-1, :], labels[:, 1:]
    return criterion(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), shape=logits.shape)


def make_private(model, dataset, *, recipe: Recipe, epsilon: float, delta: float, accountant: str):
    """The tutorial's AdamW, data loader and ``make_private_with_epsilon`` (ghost clipping), with Poisson sampling.

    Returns:
        (privacy engine, private module, private optimizer, private criterion, Poisson data loader).
    """
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, eps=recipe.adam_eps)
    loader = DataLoader(dataset, batch_size=recipe.batch_size)
    engine = PrivacyEngine(accountant=accountant)
    module, optimizer, criterion, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        criterion=torch.nn.CrossEntropyLoss(reduction="mean"),
        target_delta=delta,
        target_epsilon=epsilon,
        epochs=recipe.epochs,
        max_grad_norm=recipe.max_grad_norm,
        grad_sample_mode=recipe.grad_sample_mode,
        poisson_sampling=True,
    )
    return engine, module, optimizer, criterion, loader


def step(module, optimizer, criterion, batch, device="cpu") -> float | None:
    """One DP step on one Poisson batch; returns the batch's mean per-sequence loss (None for an empty batch).

    An empty batch is not forwarded (a Llama forward on a (0, T) batch raises): every trained parameter gets a zero
    gradient (the sum of no clipped gradients) and the optimizer still steps, so noise is added and the accountant
    counts the step.
    """
    import torch

    optimizer.zero_grad()
    if batch[0].shape[0] == 0:
        for p in optimizer.params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        return None
    loss = batch_loss(module, criterion, batch, device)
    loss.backward()
    optimizer.step()
    return loss.item()


def train(model, examples, pad_id: int, width: int, *, recipe: Recipe, epsilon: float, delta: float,
          accountant: str, max_steps: int | None, device: str = "cpu", log=print) -> dict:  # fmt: skip
    """Train as the tutorial does: ``epochs`` passes over the Poisson data loader (1/q batches each), stopping
    early after ``max_steps`` steps when given.

    Returns:
        The run's public numbers: batch (expected), steps, q, sigma, epsilon_spent (the accountant's, at ``delta``),
        train_seconds, s_per_step, batch_sizes (each step's Poisson batch size), module (the private module).
    """
    dataset = padded_dataset(examples, pad_id, width)
    engine, module, optimizer, criterion, loader = make_private(
        model.to(device), dataset, recipe=recipe, epsilon=epsilon, delta=delta, accountant=accountant
    )
    q = 1 / len(loader)
    log(f"q {q:.5f} (1/{len(loader)} batches), σ {optimizer.noise_multiplier:.4f}, {recipe.epochs} epochs")
    sizes: list[int] = []
    started = time.perf_counter()
    for epoch in range(1, recipe.epochs + 1):
        for batch in loader:
            if max_steps is not None and len(sizes) >= max_steps:
                break
            loss = step(module, optimizer, criterion, batch, device)
            sizes.append(int(batch[0].shape[0]))
            if len(sizes) % 10 == 0 or len(sizes) <= 2:
                shown = "—" if loss is None else f"{loss:.4f}"
                log(f"epoch {epoch} step {len(sizes)}: batch {sizes[-1]}, loss {shown}")
    seconds = time.perf_counter() - started
    steps = sum(n for _, _, n in engine.accountant.history)
    if steps != len(sizes):
        raise RuntimeError(f"the accountant counted {steps} steps, the loop took {len(sizes)}")
    return {
        "batch": int(optimizer.expected_batch_size),
        "steps": steps,
        "q": q,
        "sigma": float(optimizer.noise_multiplier),
        "epsilon_spent": float(engine.get_epsilon(delta)),
        "train_seconds": round(seconds, 1),
        "s_per_step": round(seconds / max(steps, 1), 2),
        "batch_sizes": sizes,
        "module": module,
    }


def peer_row(settings, out: Path, threads: int, model_path: str | None, *, max_steps: int | None = None,
             seed: int = 0, recipe: Recipe = RECIPE, log=print) -> dict:  # fmt: skip
    """Train the peer row on ``settings``' Bitext task (the ``--cpu`` preset or ``TOY_FULL``) and score it as a
    study row; returns the row (the study's keys, plus ``recipe`` and ``poisson_batch_sizes``)."""
    import datasets  # noqa: F401  (utility_bench's scoring builds tables with it)
    import opacus
    import peft
    import torch

    from dplora.contract.loader import parse_contract
    from dplora.contract.spec import ModelSection
    from dplora.data.tokens import tokenize_records
    from dplora.data.units import load_table
    from dplora.engine.model import load_model_and_tokenizer

    bench = bench_module()
    started = time.perf_counter()
    task = settings.bitext
    torch.set_num_threads(threads)
    log(f"torch threads: {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory(prefix="dplora-peer-") as tmp_name:
        tmp = Path(tmp_name)
        bench.isolate_user_state(tmp)
        path, held = bench.bitext_data(settings, tmp)
        val = bench.bitext_validation(settings, bench.STUDY_VALIDATION_ROWS)
        columns = bench.BITEXT_COLUMNS
        model_section = bench.model_section_for(settings, model_path, out)
        scorer = bench.Scorer(threads, model_section)
        contract = parse_contract(
            bench.contract_for(task, settings, path, columns, tmp / "unused", model=model_section)
        )
        base_held = bench.bitext_eval(scorer, scorer.base, held, contract)
        base_val = bench.bitext_eval(scorer, scorer.base, val, contract)
        log(f"base: held-out {base_held['loss']:.4f}, validation {base_val['loss']:.4f}")

        table = load_table(contract.data)
        examples = tokenize_records(table, scorer.tokenizer, contract.data, max_seq_len=contract.training.max_seq_len)
        torch.manual_seed(seed)
        base, _ = load_model_and_tokenizer(ModelSection(**(model_section or {"name": "smollm2-135m"})), lambda _: None)
        model, targets, trained = lora_model(base, recipe)
        log(f"N {len(examples)} records, {trained:,} trained LoRA weights on {targets} (last layer only)")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        run = train(model, examples, scorer.tokenizer.pad_token_id, contract.training.max_seq_len, recipe=recipe,
                    epsilon=EPSILON, delta=settings.delta, accountant=ACCOUNTANT, max_steps=max_steps,
                    device=device, log=log)  # fmt: skip
        folder = out / "runs" / "peer-opacus"
        run.pop("module")._module.save_pretrained(str(folder / "adapter"))
        del model, base
        adapter = scorer.model(str(folder))
        held_eval = bench.bitext_eval(scorer, adapter, held, contract)
        val_eval = bench.bitext_eval(scorer, adapter, val, contract)
        scorer.release(adapter)
    sizes = run.pop("batch_sizes")
    changes = [CHANGES]
    if max_steps is not None and run["steps"] < round(recipe.epochs / run["q"]):
        changes.append(f"stopped after {run['steps']} steps (--max-steps; σ for {recipe.epochs} epochs)")
    return {
        "task": "bitext",
        "levers": ["peer-opacus"],
        "changes": changes,
        "epsilon": EPSILON,
        "lora": {
            "r": recipe.lora_r,
            "alpha": float(recipe.lora_alpha),
            "dropout": recipe.lora_dropout,
            "target_modules": targets,
            "layers": "last" if recipe.last_layer_only else "all",
        },
        "epochs": float(recipe.epochs),
        "trained_parameters": trained,
        **{k: run[k] for k in ("batch", "steps", "q", "sigma")},
        "lr": recipe.lr,
        **{k: run[k] for k in ("epsilon_spent", "train_seconds", "s_per_step")},
        "heldout_loss": round(held_eval["loss"], 4),
        "heldout_rows": held_eval["records"],
        "share_of_control_gain": round(bench.study_share(held_eval["loss"]), 4),
        "validation_loss": round(val_eval["loss"], 4),
        "validation_rows": val_eval["records"],
        "base_validation_loss": round(base_val["loss"], 4),
        "base_heldout_loss": round(base_held["loss"], 4),
        "wall_minutes": round((time.perf_counter() - started) / 60, 1),
        "hardware": bench.device_label(threads),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "reference": bench.STUDY_REFERENCE,
        "groups": held_eval["groups"],
        "recipe": dataclasses.asdict(recipe)
        | {
            "source": SOURCE,
            "optimizer": "torch.optim.AdamW (weight decay 0.01, betas 0.9/0.999: torch's defaults)",
            "poisson_sampling": True,
            "accountant": ACCOUNTANT,
            "delta": settings.delta,
            "secure_mode": False,
            "seed": seed,
            "loss": "per-sequence mean token cross entropy over target tokens (Opacus ghost criterion, shape=(B,T,V))",
            "max_seq_len": contract.training.max_seq_len,
            "train_records": len(examples),
            "opacus": opacus.__version__,
            "peft": peft.__version__,
            "torch": torch.__version__,
        },
        "poisson_batch_sizes": {
            "min": min(sizes),
            "max": max(sizes),
            "mean": round(statistics.fmean(sizes), 2),
            "every_step": sizes,
        },
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--toy", action="store_true", help="a tiny random chat model and utility_bench's TOY_FULL data")
    ap.add_argument("--out", required=True, type=Path, help="output folder (the adapter under runs/peer-opacus)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the study: 1 per run)")
    ap.add_argument("--max-steps", type=int, help="stop after this many steps (smoke runs; ε spent is for them)")
    ap.add_argument("--seed", type=int, default=0, help="torch's global seed: LoRA init, dropout, batches, noise")
    ap.add_argument("--model-path", help="a local Hugging Face model folder instead of the packaged SmolLM2-135M")
    ap.add_argument("--study-json", type=Path, help="the study's rows (default docs/utility-study.json; see above)")
    ap.add_argument("--study-md", type=Path, help="the page its table goes in (default docs/utility.md; see above)")
    args = ap.parse_args(argv)
    if args.max_steps is not None and args.max_steps < 1:
        ap.error("--max-steps must be ≥ 1")
    if args.toy and args.model_path:
        ap.error("--toy builds its own model: drop --model-path")
    bench = bench_module()
    settings = bench.TOY_FULL if args.toy else bench.CPU
    args.out.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        print(f"[peer-opacus] {message}", file=sys.stderr, flush=True)

    row = peer_row(settings, args.out, args.threads, args.model_path, max_steps=args.max_steps, seed=args.seed, log=log)
    docs = args.out if (args.toy or args.max_steps is not None) else ROOT / "docs"
    bench.write_study(row, args.study_json or docs / "utility-study.json", args.study_md or docs / "utility.md")
    shown = {k: v for k, v in row.items() if k not in ("groups", "reference", "poisson_batch_sizes")}
    print(json.dumps(shown, indent=2, ensure_ascii=False))
    return row


if __name__ == "__main__":
    main()
