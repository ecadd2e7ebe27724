"""The adapter's model card (``adapter/README.md``): the signed release record in words, Hugging Face format.

Format: YAML front matter from ``huggingface_hub.ModelCardData`` (``library_name: peft``, ``base_model``,
``tags``) and a Markdown body (https://huggingface.co/docs/hub/model-cards). The card is written before the
release is signed and is one of its artifacts, so ``dplora verify`` catches any edit. Everything in it comes
from the record or the contract's public settings: no local path, no training text, no per-unit counts.
"""

from __future__ import annotations

from dplora.contract.spec import DataSection

TAGS = ("differential-privacy", "dp-sgd", "lora", "peft", "dplora")
UNIT_WORDS = {"row": "data row", "ticket": "ticket (all of its rows)", "user": "customer (all of their rows)"}
ADJACENCY_WORDS = {
    "add_remove": "two training sets are neighbours when one holds one more {unit} than the other (add/remove)",
    "replace_one": "two training sets are neighbours when one {unit} is replaced by another (replace-one)",
}


def model_card(record: dict, data: DataSection) -> str:
    """The model card text for one release.

    Args:
        record: The release record (predicate) of :func:`dplora.release.record.build_record`, with ``base_model``.
        data: The contract's data section (only its public column names and file format are used).
    Returns:
        UTF-8 text: ``---`` YAML front matter ``---`` then Markdown, readable by ``huggingface_hub.ModelCard``.
    Raises:
        KeyError: If the record lacks a section the card states (privacy, accounting, base_model, ...).
    """
    from huggingface_hub import ModelCardData

    if record.get("differentially_private") is False:
        return _non_private_card(record, data)
    base = record["base_model"]
    card_data = ModelCardData(
        library_name="peft", base_model=base["name_or_path"], tags=list(TAGS), pipeline_tag="text-generation"
    )
    sections = (_intro(record), _guarantee(record), _not_covered(record), _data(record, data))
    body = "\n".join((*sections, _base_model(base), _verify(record)))
    return f"---\n{card_data.to_yaml()}\n---\n\n{body}"


def _intro(record: dict) -> str:
    lora, base = record["lora"], record["base_model"]["name_or_path"]
    targets = ", ".join(f"`{m}`" for m in lora["target_modules"])
    frozen = "; A frozen at its seeded initialisation, only B trained (FFA-LoRA)" if lora.get("freeze_a") else ""
    return (
        f"# DP-LoRA adapter for {base}\n\n"
        f"A LoRA adapter (r={lora['r']}, alpha={lora['alpha']:g}, on {targets}{frozen}) fine-tuned with differentially "
        f"private SGD by dplora {record['versions'].get('dplora', '?')}. This card restates the signed release "
        "record (`release.dsse.json` beside this folder); the record is the authority.\n"
    )


def _guarantee(record: dict) -> str:
    privacy, acc, mech = record["privacy"], record["accounting"], record["mechanism"]
    unit = UNIT_WORDS.get(privacy["protected_unit"], privacy["protected_unit"])
    adjacency = ADJACENCY_WORDS.get(privacy["adjacency"], privacy["adjacency"]).format(unit=unit)
    n_source = (
        "declared in the contract as a public number"
        if acc["num_units_source"] == "contract"
        else "counted in the data (public under replace-one adjacency)"
    )
    key = f" (unit key column `{privacy['unit_key']}`)" if privacy.get("unit_key") else ""
    epsilon, delta, run_line = _total(record)
    return (
        (
            "## Privacy guarantee\n\n"
            f"(ε = {epsilon:.4f}, δ = {delta:g})-differential privacy for one **{unit}**{key}: "
            f"{privacy['statement']}.\n\n" + run_line + f"- Adjacency: {adjacency}.\n"
            f"- Accountant: `{acc['accountant']}` ({acc['accountant_version']}), target ε = {acc['target_epsilon']:g}, "
            f"{acc['steps_done']} of {acc['steps_planned']} planned steps done.\n"
            f"- Mechanism: Poisson sampling of units at q = {acc['sample_rate']:.6g}, {privacy['clipping']} "
            f"with C = {mech['max_grad_norm']:g}, Gaussian noise σ = {acc['noise_multiplier']:.6g} (std σ·C) once per "
            f"step from OS entropy.\n"
            f"- N = {acc['num_units']} protected units, {n_source}.\n" + _optimizer(record) + ceiling_line(record)
        )
        + _tuning(record)
        + _audit(record)
    )


def _total(record: dict) -> tuple[float, float, str]:
    """(ε, δ) of everything the release depends on, and the line that states this run's own ε below it.

    A ``dplora sweep`` release depends on every trial (the choice and the signed ``tuning`` entry are functions of
    all of them), a release with an attached audit on its private data on the audit run too (``audit.composed``,
    which for a sweep composes every trial with the audit): the headline states their composition, the single
    run's (ε, δ) is a line below. Otherwise the run's own (ε, δ) and no line.
    """
    acc = record["accounting"]
    composed = (record.get("audit") or {}).get("composed")
    tuning = record.get("tuning")
    if isinstance(composed, dict):
        total, what = composed, "the release without its attached audit run"
        if tuning:
            what = "the chosen trial alone, without the other trials and the attached audit run"
    elif isinstance(tuning, dict):
        total, what = tuning, f"the chosen trial alone, without the other {tuning['trials'] - 1} trial(s)"
    else:
        return acc["epsilon_spent"], acc["delta"], ""
    line = (
        f"- This is the total of what the release depends on; {what}: ε = {acc['epsilon_spent']:.4f}, "
        f"δ = {acc['delta']:g}.\n"
    )
    return total["total_epsilon"], total["total_delta"], line


OPTIMIZER_WORDS = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "dp_adambc": "DP-AdamBC"}


def _optimizer(record: dict) -> str:
    """The optimizer line ('' for a record without ``optimization.optimizer``): its name and public parameters."""
    opt = (record.get("optimization") or {}).get("optimizer")
    if not isinstance(opt, dict):
        return ""
    name = OPTIMIZER_WORDS.get(opt.get("name"), opt.get("name"))
    lr = record["optimization"].get("lr")
    if opt.get("name") == "dp_adambc":
        params = (
            f"β = ({', '.join(f'{b:g}' for b in opt['betas'])}), γ = {opt['gamma']:g}, Φ = "
            f"{opt['noise_variance_phi']:.6g} (the DP noise variance (σC/E)² removed from its second moment; "
            "Tang, Shpilevskiy & Lécuyer, AAAI 2024)"
        )
    elif opt.get("name") == "sgd":
        params = "no momentum"
    else:
        params = f"β = ({', '.join(f'{b:g}' for b in opt['betas'])}), eps = {opt['eps']:g}"
    return (
        f"- Optimizer: {name} at lr {lr:g}, {params}; it reads only the noised gradient (post-processing, no "
        "privacy effect).\n"
    )


CEILING_UNIT_WORDS = {
    "row": "one data row was used",
    "ticket": "one ticket was used",
    "user": "one customer's records were used",
}


def ceiling_line(record: dict) -> str:
    """The model card's line stating the attack ceiling in plain words ('' for an older record without one).

    Args:
        record: a release predicate; reads ``attack_ceiling``, ``privacy.protected_unit`` and, where present,
            ``audit.composed.attack_ceiling`` and ``tuning.attack_ceiling``
            (:func:`dplora.accounting.ceiling.ceiling_sentence` words them).

    With an attached audit on the private data (``audit.composed``) the sentence states the runs' ceiling
    together (:func:`dplora.release.audit_section.composed_attack_ceiling`), and for a ``dplora sweep`` release
    every trial's composed (``tuning.attack_ceiling``), not the release's alone.
    """
    from dplora.accounting.ceiling import ceiling_sentence

    entry = record.get("attack_ceiling")
    if not entry:
        return ""
    composed = (record.get("audit") or {}).get("composed")
    tuning = record.get("tuning")
    if isinstance(composed, dict) and composed.get("attack_ceiling"):
        entry = composed["attack_ceiling"]  # an attached audit on the private data: both runs' outputs are public
    elif isinstance(tuning, dict) and tuning.get("attack_ceiling"):
        entry = tuning["attack_ceiling"]  # a sweep: the signed choice is a function of every trial
    unit = record["privacy"]["protected_unit"]
    words = ceiling_sentence(entry, CEILING_UNIT_WORDS.get(unit, "one protected unit was used"))
    return f"- What ε means to an attacker: {words}" + (
        f" (from the whole privacy profile of {'these runs composed' if entry.get('holds_for') else 'this mechanism'}"
        ", not from one (ε, δ) pair).\n"
        if entry.get("available")
        else ".\n"
    )


def _audit(record: dict) -> str:
    """An attached audit on the private data (``dplora audit --attach``): the claim is the two runs composed."""
    composed = (record.get("audit") or {}).get("composed")
    if not composed:
        return ""
    return (
        f"- Audit: an audit run on the same private units is attached to this record; release and audit together "
        f"spend ε = {composed['total_epsilon']:.4f}, δ = {composed['total_delta']:g} ({composed['composition']}): "
        "that total is what this record claims.\n"
    )


def _tuning(record: dict) -> str:
    """A ``dplora sweep`` release: the total over all its charged trials, and whether the choice is covered."""
    t = record.get("tuning")
    if not t:
        return ""
    return (
        f"- Tuning: chosen among {t['trials']} trials (`dplora sweep`), each charged; all trials together spend "
        f"ε = {t['total_epsilon']:.4f}, δ = {t['total_delta']:g} ({t['composition']}). {t['statement']}.\n"
    )


def _not_covered(record: dict) -> str:
    population = record.get("population")
    ledger = f"the `dplora ledger` for population `{population}`" if population else "`dplora ledger`"
    return (
        "### What it does not cover\n\n"
        f"- Anything larger than one {UNIT_WORDS.get(record['privacy']['protected_unit'], 'unit')}: "
        "several units of one person are protected only by group privacy (about k·ε for k units).\n"
        "- The base model and its own training data, and any data outside the training file.\n"
        f"- Other runs on the same people: {_alone(record)}; see {ledger} for the total.\n"
        f"- Not released: {record['not_included']}.\n"
        f"- The seed {record['seed']['scope']}.\n"
        "- Noise is sampled in floating point; the guarantee is for the ideal Gaussian mechanism.\n"
        + _warm_start_not_covered(record)
    )


def _alone(record: dict) -> str:
    """What the headline ε is for, in the card's 'other runs' line."""
    if record.get("tuning") or (record.get("audit") or {}).get("composed"):
        return "the ε above is for this release and the runs it states (sweep trials, an attached audit) alone"
    return "this ε is for this run alone"


def _warm_start_not_covered(record: dict) -> str:
    """The public warm-start file, outside ε ('' without ``data.public_warm_start``)."""
    warm = record.get("public_warm_start")
    if not warm:
        return ""
    return (
        f"- The public warm-start file `{warm['file']}`: declared public by the contract and trained on without "
        "noise, so no ε covers it; if it holds private data, the guarantee above does not hold for that data.\n"
    )


def _warm_start(record: dict) -> str:
    """The public warm start in words ('' without ``data.public_warm_start``): file, digest, settings, no ε."""
    warm = record.get("public_warm_start")
    if not warm:
        return ""
    return (
        f" Before training on the data above, the adapter was fitted without noise on `{warm['file']}` (sha256 "
        f"`{warm['sha256']}`, {warm['records']} records), a file the contract declares **public**: {warm['steps']} "
        f"AdamW steps of {warm['batch_size']} records at lr {warm['lr']:g}. No ε is charged for it because it never "
        "sees the private data; declaring private data public voids the guarantee."
    )


def _columns(d) -> str:
    """What the loss covered, in words."""
    if d.text_column is not None:
        return f"every token of column `{d.text_column}`"
    if d.kind == "messages" and d.completion_column is not None:
        turns = "the assistant turns" if d.train_on == "assistant" else "every token"
        return f"{turns} of the completions in column `{d.completion_column}` given the prompts in `{d.messages_key}`"
    if d.kind == "messages":
        turns = "the assistant turns" if d.train_on == "assistant" else "every token"
        return f"{turns} of the conversations in column `{d.messages_key}`"
    return f"the responses in column `{d.response_column}` given the prompts in `{d.prompt_column}`"


def _template(record: dict) -> str:
    """The chat template line of the card ('' for a record without a ``tokenization`` entry)."""
    tok = record.get("tokenization")
    if not tok:
        return ""
    if tok["chat_template_sha256"] is None:
        return " Records were tokenized as raw text (no chat template)."
    return (
        f" Records were rendered by the {tok['chat_template']} chat template, sha256 `{tok['chat_template_sha256']}`."
    )


def _data(record: dict, data: DataSection) -> str:
    d = data
    columns = _columns(d)
    files = ", ".join(f"`{name}`" for name in record["data"]["files"])
    files += "" if d.format == "auto" else f" ({d.format})"
    digest = record["data"]["digest"]
    keyed = (
        "a keyed HMAC-SHA256 digest of each file is in the record; only the data owner, who holds the key, can check it"
        if digest.get("keyed")
        else "no digest of the data is released (a plain hash would let anyone confirm a guess about it)"
    )
    return (
        "## Training data\n\n"
        f"Described, never shown: {files}, trained on {columns}; "
        f"{record['accounting']['num_units']} protected units (the public N of the record). "
        f"{keyed[0].upper()}{keyed[1:]}.{_template(record)}{_warm_start(record)}\n\n"
        "Per-step losses, realised batch sizes, step times and any held-out evaluation on private data are in the "
        "`<release folder>.private/` folder beside the release, outside the DP guarantee: never ship that folder.\n"
    )


def _base_model(base: dict) -> str:
    rows = "\n".join(f"| `{name}` | `{digest}` |" for name, digest in sorted(base["files"].items()))
    package = base.get("package")
    source = f"{base['note']}\n\n" if base.get("note") else ""
    if base.get("commit"):
        source += f"Hub revision `{base.get('revision')}`, commit `{base['commit']}` (from the local cache).\n\n"
    if package:
        source += f"Source file: `{package['file']}` from {package['name']} {package['version']}, "
        source += f"sha256 `{package['sha256']}`.\n\n"
    quant = base.get("quantization")
    if quant:
        source += (
            f"Trained on a {quant['bits']}-bit base: {quant['method']} {quant['bitsandbytes_version']}, "
            f"`{quant['quant_type']}`, double quantization {'on' if quant['double_quant'] else 'off'}, compute dtype "
            f"`{quant['compute_dtype']}`; the files below are the unquantized weights it was quantized from when "
            "loaded. Load the base the same way (`BitsAndBytesConfig`) to reproduce the training forward.\n\n"
        )
    load = (
        "```python\nfrom peft import AutoPeftModelForCausalLM\n\n"
        'model = AutoPeftModelForCausalLM.from_pretrained("path/to/adapter")\n```\n'
    )
    if not base.get("resolvable", False):
        load = (
            f"`{base['name_or_path']}` is a local name, not a Hub id: load that base model yourself "
            "(and check it with `dplora verify --base-model`), then\n\n```python\nfrom peft import PeftModel\n\n"
            'model = PeftModel.from_pretrained(base_model, "path/to/adapter")\n```\n'
        )
    return (
        "## Base model\n\n"
        f"`{base['name_or_path']}`. {source}"
        f"The adapter was trained on these exact files (sha256, also in the signed record):\n\n"
        f"| file | sha256 |\n|---|---|\n{rows}\n\n{load}"
    )


def _verify(record: dict) -> str:
    return (
        "## How to verify\n\n"
        "With the signer's Ed25519 public key, from the release folder's parent:\n\n"
        "```bash\ndplora verify RELEASE_DIR --public-key signing.pub            # signature, every file's sha256\n"
        "dplora verify RELEASE_DIR --public-key signing.pub --base-model BASE_DIR_OR_GGUF\n```\n\n"
        "`release.dsse.json` is a DSSE envelope (in-toto Statement v1, predicate "
        "`https://dplora.dev/release/v1`) that securesystemslib's `Envelope.verify` accepts; "
        "`release.sigstore.json` holds the same envelope as a Sigstore bundle v0.3 with a public-key hint.\n"
    )


NON_PRIVATE_TAGS = ("not-differentially-private", "lora", "peft", "dplora")


def _non_private_card(record: dict, data: DataSection) -> str:
    """The card of a non-private control run (:mod:`dplora.mechanism.control`): it says so first, and states no ε."""
    from huggingface_hub import ModelCardData

    base, training = record["base_model"], record["training"]
    card_data = ModelCardData(
        library_name="peft",
        base_model=base["name_or_path"],
        tags=list(NON_PRIVATE_TAGS),
        pipeline_tag="text-generation",
    )
    columns = _columns(data)
    files = ", ".join(f"`{name}`" for name in record["data"]["files"])
    body = (
        f"# NOT DIFFERENTIALLY PRIVATE: LoRA adapter (control run) for {base['name_or_path']}\n\n"
        f"**{record['statement']}.**\n\n"
        "This adapter is the non-private control of a DP contract (`privacy.enabled: false`): the same data, "
        f"model, steps and Poisson sampling (q = {training['sample_rate']:.6g}, {training['steps_done']} steps, "
        f"{training['num_units']} units) with no clipping and no noise, to measure what privacy costs. Do not "
        "publish it as a private model.\n\n"
        f"## Training data\n\nDescribed, never shown: {files}, trained on {columns}.{_template(record)}"
        f"{_warm_start(record)}\n\n" + _base_model(base) + "\n## How to verify\n\n"
        "`release.dsse.json` is signed under the predicate type `https://dplora.dev/non-private/v1`; "
        "`dplora verify RELEASE_DIR --public-key signing.pub` prints NOT DIFFERENTIALLY PRIVATE and exits 6 "
        "(0 with `--allow-non-private`).\n"
    )
    return f"---\n{card_data.to_yaml()}\n---\n\n{body}"
