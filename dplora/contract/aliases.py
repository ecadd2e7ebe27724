"""Names other fine-tuning tools use for contract keys, and the nearest-key suggestion for an unknown key.

:data:`ALIASES` maps a key name as TRL (``SFTConfig``), axolotl or the Hugging Face ``Trainer``
(``TrainingArguments``) and peft's ``LoraConfig`` spell it to the dplora key that does that job, with a note where
the meaning differs. docs/contract.md ("Names from TRL, axolotl and the HF Trainer") prints this table; a test
checks that the page and this table agree row for row. Sources: transformers ``TrainingArguments``, TRL
``SFTConfig``, peft ``LoraConfig`` and axolotl's config reference (parameter names as of 2026).
"""

from __future__ import annotations

import difflib

# their name -> (dplora key, note or ""). A name may be typed under any section; the suggestion names the full key.
ALIASES: dict[str, tuple[str, str]] = {
    "learning_rate": ("training.lr", ""),
    "num_train_epochs": ("training.epochs", ""),
    "num_epochs": ("training.epochs", ""),
    "max_steps": ("training.steps", "T logical (DP) steps"),
    "per_device_train_batch_size": ("training.physical_batch_size", "records per forward pass, memory only"),
    "micro_batch_size": ("training.physical_batch_size", "records per forward pass, memory only"),
    "train_batch_size": ("training.expected_batch_size", "the logical batch: expected units per DP step"),
    "batch_size": ("training.expected_batch_size", "the logical batch: expected units per DP step"),
    "gradient_accumulation_steps": (
        "training.expected_batch_size",
        "there is no accumulation key: expected_batch_size is the logical batch (expected units per DP step, "
        "q = B/N) and physical_batch_size the records per forward pass, accumulated into one step",
    ),
    "lora_r": ("lora.r", ""),
    "lora_alpha": ("lora.alpha", ""),
    "lora_dropout": ("lora.dropout", ""),
    "lora_target_modules": ("lora.target_modules", ""),
    "bf16": ("model.dtype", "bf16 (auto picks bf16 on a GPU that has it)"),
    "fp16": ("model.dtype", "no fp16: model.dtype is auto, bf16 or fp32"),
    "torch_dtype": ("model.dtype", "auto, bf16 or fp32"),
    "load_in_4bit": ("model.quantization", "4bit (NF4, QLoRA)"),
    "load_in_8bit": ("model.quantization", "8-bit (LLM.int8) is refused; 4bit is allowed"),
    "flash_attention": ("model.attn_implementation", "flash_attention_2"),
    "base_model": ("model.path", "a local folder or .gguf file; a Hub id goes in model.name"),
    "model_name_or_path": ("model.path", "a local folder or .gguf file; a Hub id goes in model.name"),
    "max_seq_length": ("training.max_seq_len", ""),
    "max_length": ("training.max_seq_len", ""),
    "sequence_len": ("training.max_seq_len", ""),
    "dataset_text_field": ("data.text_column", ""),
    "val_set_size": ("data.eval_fraction", "a fraction of the protected units"),
    "lr_scheduler_type": ("training.lr_schedule", "constant, linear or cosine"),
    "warmup_ratio": ("training.warmup_steps", "give steps, not a ratio"),
    "optim": ("training.optimizer", "adamw, adam, sgd or dp_adambc"),
    "epsilon": ("privacy.target_epsilon", ""),
    "target_delta": ("privacy.delta", ""),
    "per_sample_max_grad_norm": ("privacy.max_grad_norm", "C, per protected unit"),
    "train_on_inputs": ("data.train_on", "false is assistant, the default; true is all"),
    "assistant_only_loss": ("data.train_on", "assistant, the default; all trains every token"),
    "completion_only_loss": ("data.response_column", "a prompt/response record trains on its response only"),
    "datasets": ("data.path", "one local csv, jsonl, json or parquet file"),
    "dataset_name": ("data.path", "one local csv, jsonl, json or parquet file; a Hub dataset is not fetched"),
    "lr_scheduler": ("training.lr_schedule", "constant, linear or cosine"),
    "adapter": ("model.quantization", "qlora is 4bit; LoRA is dplora's only adapter"),
    "lora_target_linear": ("lora.target_modules", "all-linear"),
    "wandb_project": ("training.report_to", "wandb: public numbers only"),
    # command-line spellings (``dplora train c.yaml --model X``): by spelling they would go to --data-key or --json
    "model": ("model.path", "a local folder or .gguf file; a Hub id goes in model.name"),
    "data": ("data.path", "one local csv, jsonl, json or parquet file"),
    "train_file": ("data.path", "one local csv, jsonl, json or parquet file"),
    "out": ("training.output_dir", ""),
}
# Other tools' names that dplora has no key for and that spelling would pair with an unrelated one (model_type is
# not "the section model": the architecture is read from the model's own config). Listed among those with no key.
NO_KEY = frozenset({"model_type", "tokenizer_type"})
# A name that is a dplora key in another section (e.g. training.max_grad_norm, the HF Trainer's clip).
_MOVED_NOTE = {
    ("training", "max_grad_norm"): (
        "the HF Trainer's max_grad_norm clips the whole batch, dplora's clips each protected unit"
    ),
    (None, "max_grad_norm"): "the HF Trainer's max_grad_norm clips the whole batch, dplora's clips each protected unit",
}


def _keys(contract_cls) -> dict[str, list[str]]:
    """{section: [key, ...]} of the contract model."""
    sections = {}
    for name, field in contract_cls.model_fields.items():
        sections[name] = list(field.annotation.model_fields)
    return sections


def hint(section: str | None, key: str, contract_cls) -> tuple[str, str, str] | None:
    """What dplora calls the unknown key ``key`` (in ``section``, None at the top level): ``(kind, target, note)``
    or None when nothing is near.

    ``kind`` is ``alias`` (another tool's name for ``target``), ``moved`` (a dplora key of another section),
    ``near`` (the nearest key by spelling) or ``section`` (the nearest section by spelling). Meaning comes before
    spelling: :data:`ALIASES`, then the same name in another section, then ``difflib.get_close_matches`` (cutoff
    0.6) in the same section (or among sections at the top level), then in any section (cutoff 0.75); a name in
    :data:`NO_KEY` gets None.
    """
    sections = _keys(contract_cls)
    if key in ALIASES:
        return ("alias", *ALIASES[key])
    if key in NO_KEY:
        return None
    for name, keys in sections.items():
        if name != section and key in keys:
            return "moved", f"{name}.{key}", _MOVED_NOTE.get((section, key), "")
    if section is None:
        near = difflib.get_close_matches(key, list(sections), n=1, cutoff=0.6)
        return ("section", near[0], "") if near else None
    near = difflib.get_close_matches(key, sections.get(section, []), n=1, cutoff=0.6)
    if near:
        return "near", f"{section}.{near[0]}", ""
    everywhere = [f"{s}.{k}" for s, keys in sections.items() for k in keys]
    near = difflib.get_close_matches(key, [k.split(".", 1)[1] for k in everywhere], n=1, cutoff=0.75)
    if near:
        return "near", next(k for k in everywhere if k.split(".", 1)[1] == near[0]), ""
    return None


def suggest(section: str | None, key: str, contract_cls) -> str:
    """A hint for the unknown key ``key`` (in ``section``, None at the top level), or "" when there is none
    (:func:`hint` in words).

    Returns:
        e.g. ``"dplora calls it training.lr"``, ``"did you mean training.lr?"`` or ``""``.
    """
    found = hint(section, key, contract_cls)
    if found is None:
        return ""
    kind, target, note = found
    tail = f" — {note}" if note else ""
    if kind == "alias":
        return f"dplora calls it {target}{tail}"
    if kind == "section":
        return f"did you mean the section {target}?"
    if kind == "moved" and section is None:
        return f"did you mean {target}? (keys go under their section){tail}"
    return f"did you mean {target}?{tail}"
