"""Held-out evaluation: per-token loss and perplexity of the base model and of base + adapters.

The held-out records are tokenized and masked exactly as in training (:func:`dplora.data.tokens.tokenize_records`,
:func:`dplora.engine.batch.collate`): prompt and padding tokens carry label −100 and count for nothing, EOS is a
target. The loss is the mean negative log-likelihood per target token over the whole set, in nats::

    loss = Σ_records Σ_targets −log p(token | prefix) / (number of target tokens),   perplexity = exp(loss)

(token-weighted, unlike the per-sequence mean the training step uses). With ``data.label_column`` the
evaluation also generates a reply greedily for each held-out prompt and reports exact-match accuracy against
the label (both stripped of surrounding whitespace). With ``data.group_column`` (or ``dplora eval
--group-column``) it also reports the same numbers per group (:func:`group_stats`): DP is known to hurt rare
groups most, and the overall mean hides it.

Privacy: the numbers are a query on the held-out records. Unless ``data.eval_public: true`` declares the
held-out file public, they are NOT covered by DP: printed to the operator so labelled, written to
``<output_dir>.private/metrics.jsonl`` under ``not_covered_by_dp`` (beside the release, never in it), never into
the signed record, and never printed with held-out
text. Only a declared-public set's numbers may enter the record (``Evaluation.to_dict``). Group names are printed:
the group column must hold **public labels** (the category names of a published schema, never free text), and
a group with fewer than :data:`MIN_GROUP_RECORDS` held-out records is not shown by name, only counted, so that
a rare value (which may be a private string) and numbers about a handful of people stay out of the report.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dplora.contract.labels import declared_labels
from dplora.contract.spec import DataSection
from dplora.data.cells import tokenize_cells
from dplora.errors import BadInputError, excerpt
from dplora.evaluate.report import group_stats

if TYPE_CHECKING:
    from dplora.release.locate import ReleaseInputs


class EvalBuild(Protocol):
    """What evaluation reads of the run's settings: tokens per record and records per forward (memory only). The
    contract's training section has them, and so has a run's compiled :class:`dplora.run.config.RunConfig`."""

    max_seq_len: int

    @property
    def fixed_physical_batch_size(self) -> int: ...


NOT_COVERED = "NOT COVERED BY DP: computed on private held-out data; never in the signed record"
PUBLIC = "held-out set declared public (data.eval_public: true)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeldOutLoss:
    """Loss of one model on the held-out set.

    Attributes:
        loss: mean negative log-likelihood per target token, nats.
        perplexity: exp(loss) (∞ above exp(700)).
        tokens: target tokens counted.
        records: held-out records.
    """

    loss: float
    perplexity: float
    tokens: int
    records: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Evaluation:
    """Base vs adapters on one held-out set.

    Attributes:
        base, adapter: :class:`HeldOutLoss` without and with the adapters.
        source: where the held-out set came from, in words (file names only, never text).
        public: the held-out set is declared public (its numbers may enter the record).
        differentially_private: the adapters come from a DP run (False for a control).
        accuracy: with ``data.label_column``: {"column", "records", "base", "adapter"} exact-match accuracy.
        groups: with a group column: {"column", "base", "adapter" (lists of :class:`GroupStat`), "hidden"}.
        classification: with ``data.task: classification``: {"metric", "calibration", "labels",
            "calibration_input", "records", "out_of_set", "base", "adapter"}
            (:func:`dplora.evaluate.classify.classification_stats` per model).
    """

    base: HeldOutLoss
    adapter: HeldOutLoss
    source: str
    public: bool
    differentially_private: bool
    accuracy: dict | None = None
    groups: dict | None = None
    classification: dict | None = None

    @property
    def label(self) -> str:
        """How the numbers may be used, in words."""
        return PUBLIC if self.public else NOT_COVERED

    def to_dict(self) -> dict:
        """JSON-ready numbers (∞ becomes None, so the dict is canonical JSON)."""

        def finite(x):
            return x if isinstance(x, float) and math.isfinite(x) else (None if isinstance(x, float) else x)

        out = {
            "held_out": self.source,
            "public": self.public,
            "label": self.label,
            "metric": "mean negative log-likelihood per target token (nats), same masking as training",
            "base": {k: finite(v) for k, v in dataclasses.asdict(self.base).items()},
            "adapter": {k: finite(v) for k, v in dataclasses.asdict(self.adapter).items()},
        }
        if self.accuracy is not None:
            out["exact_match"] = self.accuracy
        if self.groups is not None:
            g = self.groups
            out["groups"] = {
                "column": g["column"],
                "hidden": g["hidden"],
                **{
                    m: [{k: finite(v) for k, v in dataclasses.asdict(x).items()} for x in g[m]]
                    for m in ("base", "adapter")
                },
            }
        if self.classification is not None:
            c = self.classification
            out["classification"] = {
                **{k: v for k, v in c.items() if k not in ("base", "adapter")},
                **{m: {**c[m], "bias": {k: finite(v) for k, v in c[m]["bias"].items()}} for m in ("base", "adapter")},
            }
        return out


def token_nll(model, batch: dict):
    """Per-sequence summed token NLL and target-token count, masked as in training.

    Args:
        model: a causal LM; ``batch`` from :func:`dplora.engine.batch.collate` (shapes (B, L)).

    Returns:
        (nll_sum, tokens): tensors of shape (B,), nats and counts.
    """
    import torch.nn.functional as F

    from dplora.engine.batch import IGNORE_INDEX

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits, targets = logits[:, :-1, :].float(), batch["labels"][:, 1:]
    tok = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).view(targets.shape)
    mask = targets != IGNORE_INDEX
    return (tok * mask).sum(dim=1), mask.sum(dim=1)


def record_nll(
    model, examples: list, *, pad_id: int, device, batch_size: int, on_batch=None
) -> tuple[list[float], list[int]]:
    """Summed target-token NLL (nats) and target-token count of each record, in batches (no gradient).

    Args:
        examples: R (input_ids, labels) pairs as :func:`dplora.data.tokens.tokenize_records` makes them.
        on_batch: called with no argument after each of the ceil(R / batch_size) batches (progress).

    Returns:
        (nll, tokens): two lists of length R.
    """
    import torch

    from dplora.engine.batch import collate

    nll, tokens = [], []
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = collate(examples[start : start + batch_size], pad_id, device=device)
            s, n = token_nll(model, batch)
            nll += s.double().tolist()
            tokens += [int(x) for x in n.tolist()]
            if on_batch is not None:
                on_batch()
    return nll, tokens


def held_out_loss(model, examples: list, *, pad_id: int, device, batch_size: int, per_record=None) -> HeldOutLoss:
    """Mean per-token loss of ``model`` over ``examples`` ((input_ids, labels) pairs), in batches.

    Args:
        per_record: the (nll, tokens) of :func:`record_nll` if already computed (then no model call).

    Raises:
        BadInputError: the held-out set has no target token.
    """
    nll, tokens = per_record or record_nll(model, examples, pad_id=pad_id, device=device, batch_size=batch_size)
    total, count = math.fsum(nll), sum(tokens)
    if count == 0:
        raise BadInputError("the held-out set has no target token (every reply was truncated away?)")
    loss = total / count
    return HeldOutLoss(
        loss=loss, perplexity=math.exp(loss) if loss < 700 else math.inf, tokens=count, records=len(examples)
    )


def exact_match_rows(model, tokenizer, table, data: DataSection, training: EvalBuild, device) -> list[bool]:
    """Whether each held-out prompt's greedy reply equals its label (both stripped).

    Args:
        model: anything with Hugging Face's ``generate(input_ids, attention_mask, generation_config)``.
        tokenizer: the run's tokenizer.
        table: the held-out ``datasets.Dataset`` (``data.prompt_column``; ``data.label_column`` where present: a
            jsonl file whose records all lack it gives "" labels).
        data, training: the contract's data section and the settings the prompt is formatted and cut with, as in
            training (:func:`dplora.evaluate.generate.generate_replies`).
        device: where the prompts go.

    Returns:
        One bool per row, in table order. Greedy decoding of at most (the longest label's tokens + 2) new tokens,
        capped at :data:`dplora.evaluate.generate.MAX_NEW_TOKENS`.
    """
    from dplora.evaluate.generate import MAX_NEW_TOKENS, Sampling, generate_replies

    prompts = [str(p) for p in table[data.prompt_column]]
    label = data.label_column
    cells = table[label] if label in table.column_names else [None] * table.num_rows  # jsonl: no record has it
    labels = ["" if x is None else str(x).strip() for x in cells]
    longest = max(len(ids) for ids in tokenize_cells(tokenizer, labels, training.max_seq_len))
    sampling = Sampling(max_new_tokens=min(longest + 2, MAX_NEW_TOKENS))
    replies = generate_replies(
        model, tokenizer, prompts, data=data, training=training, sampling=sampling, device=device
    )
    return [r.strip() == y for r, y in zip(replies, labels, strict=True)]


class HeldOutDataProblem(BadInputError):
    """A held-out set that cannot be evaluated because of what its RECORDS hold (none, or no target token left),
    not because of its schema: on a private set, a statistic of the private data (``train`` then skips the
    evaluation instead of refusing; see :func:`dplora.recipe.build`)."""


def check_held_out(table, tokenizer, data: DataSection, training: EvalBuild, group_column: str | None = None) -> None:
    """Refuse a held-out set that cannot be evaluated, before any training: no target token, no label column,
    no group column (``group_column``, else ``data.group_column``).

    Raises:
        HeldOutDataProblem: no record, or no target token (a fact about the records).
        BadInputError: a label or group column missing from a csv header or parquet schema (a schema fact),
            naming the problem (never a record's text).
    """
    from dplora.data.tokens import tokenize_records

    if table.num_rows == 0:
        raise HeldOutDataProblem("the held-out set is empty (no unit fell on the held-out side of data.eval_fraction)")
    if not any(
        y != -100
        for _, labels in tokenize_records(table, tokenizer, data, max_seq_len=training.max_seq_len)
        for y in labels
    ):
        raise HeldOutDataProblem("the held-out set has no target token (every reply was truncated away?)")
    label = data.label_column
    if label is not None and label not in table.column_names and _schema_is_public(data):
        raise BadInputError(f"the held-out data has no column {label!r} (data.label_column)")
    group = group_column or data.group_column
    if group is not None and group not in table.column_names and _schema_is_public(data):
        raise BadInputError(f"the held-out data has no column {excerpt(group)} (the group column)")
    if data.task == "classification":  # the declared label set: the contract and file identity only
        declared_labels(data)


def _schema_is_public(data: DataSection) -> bool:
    """A missing column is a schema fact only where the columns do not depend on the records: a csv header or a
    parquet schema. In jsonl a column exists when ANY record has the key, so its absence is a statistic of the
    records: there a missing label or group column reads as empty cells, never a refusal."""
    path = data.eval_path or data.path
    return data.format in ("csv", "parquet") or str(path).lower().endswith((".csv", ".parquet"))


def evaluate_model(
    peft_model,
    tokenizer,
    table,
    data: DataSection,
    training: EvalBuild,
    *,
    device,
    source: str,
    public: bool,
    private_run: bool,
    group_column: str | None = None,
    progress=None,
) -> Evaluation:
    """Base (adapters disabled) vs adapters on the held-out ``table``; restores the model's train/eval mode.

    Args:
        peft_model: the peft model holding the adapters (trained in memory, or loaded from a release).
        table: the held-out records (``datasets.Dataset`` with the contract's columns).
        source: where ``table`` came from, in words.
        public: the held-out set is declared public.
        private_run: the adapters come from a DP run.
        group_column: report per group of this column (default ``data.group_column``; None: no groups).
        progress: a :class:`dplora.run.progress.BatchReporter` (``start(total)``, ``advance(count)``) or None;
            it counts 2 · (ceil(R / physical_batch_size) loss batches + R greedy replies with a label column
            + R + 1 ranked prompts with ``data.task: classification``).

    With ``data.task: classification`` each model also ranks the declared labels for every held-out prompt
    (:mod:`dplora.evaluate.classify`: length-normalised; calibrated on a content-free input where
    ``data.calibration: contextual``, both scorings reported): accuracy and per-label recall, a record whose
    response is outside the label set scored wrong and counted.

    Returns:
        :class:`Evaluation`.

    Raises:
        BadInputError: no target token in the held-out set, a missing label or group column, or a bad label set.
    """
    from dplora.data.tokens import tokenize_records
    from dplora.evaluate import classify

    group_column = group_column or data.group_column
    check_held_out(table, tokenizer, data, training, group_column)
    examples = tokenize_records(table, tokenizer, data, max_seq_len=training.max_seq_len)
    batch = training.fixed_physical_batch_size
    was_training = peft_model.training
    peft_model.eval()
    rows: dict[str, tuple] = {}
    replies = len(examples) if data.label_column else 0
    labels = declared_labels(data) if data.task == "classification" else None
    ranked = len(examples) + 1 if labels is not None else 0  # the content-free input, then every prompt
    tick = progress.advance if progress is not None else None
    if progress is not None:
        progress.start(2 * (math.ceil(len(examples) / batch) + replies + ranked))
    prompts = [str(p) for p in table[data.prompt_column]] if labels is not None else []
    scored: dict[str, tuple] = {}

    def measure(name: str) -> HeldOutLoss:
        nll, tokens = record_nll(
            peft_model, examples, pad_id=tokenizer.pad_token_id, device=device, batch_size=batch, on_batch=tick
        )
        right = exact_match_rows(peft_model, tokenizer, table, data, training, device) if data.label_column else None
        if tick is not None and replies:
            tick(replies)
        rows[name] = (nll, tokens, right)
        if labels is not None:
            on_prompt = (lambda: tick(1)) if tick is not None else None
            scored[name] = classify.classify(
                peft_model, tokenizer, prompts, labels, data, training, device=device, on_prompt=on_prompt
            )
        return held_out_loss(peft_model, examples, pad_id=0, device=device, batch_size=batch, per_record=(nll, tokens))

    try:
        adapter = measure("adapter")
        with peft_model.disable_adapter():
            base = measure("base")
    finally:
        peft_model.train(was_training)
    accuracy = groups = None
    if data.label_column:
        accuracy = {"column": data.label_column, "records": table.num_rows}
        accuracy |= {m: sum(rows[m][2]) / len(rows[m][2]) for m in ("base", "adapter")}
    if group_column is not None:
        # an empty cell is one more group: never a refusal (an exit code that read private cells would be private);
        # a jsonl column no held-out record has is all empty cells
        cells = table[group_column] if group_column in table.column_names else [None] * table.num_rows
        values = ["(empty)" if v is None else v for v in cells]
        groups = {"column": group_column}
        for m in ("base", "adapter"):
            groups[m], groups["hidden"] = group_stats(values, *rows[m])
    classification = None
    if labels is not None:
        gold = classify.gold_labels(table, data)
        known = set(labels)
        calibration = classify.calibration(data)
        classification = {
            "metric": "argmax over the declared labels of the mean log-likelihood per label token (nats)"
            + (
                " minus that of the content-free input (contextual calibration, Zhao et al. 2021)"
                if calibration == "contextual"
                else "; the *_calibrated numbers subtract that of the content-free input first "
                "(contextual calibration, Zhao et al. 2021)"
            ),
            "calibration": calibration,
            "labels": len(labels),
            "calibration_input": classify.calibration_text(data),
            "records": len(gold),
            "out_of_set": sum(y not in known for y in gold),  # scored wrong, never refused
        }
        for m in ("base", "adapter"):
            bias, scores = scored[m]
            classification[m] = classify.classification_stats(labels, gold, scores, bias, calibration=calibration)
    return Evaluation(
        base=base,
        adapter=adapter,
        source=source,
        public=public,
        differentially_private=private_run,
        accuracy=accuracy,
        groups=groups,
        classification=classification,
    )


def held_out_source(data: DataSection, eval_path: Path | None = None) -> tuple[str, bool]:
    """(the held-out set in words, declared public) for the contract's set (its data section) or an explicit file."""
    if eval_path is not None:
        return f"--eval-path {Path(eval_path).name} (not declared public)", False
    if data.eval_path is not None:
        return f"data.eval_path {Path(data.eval_path).name}", data.eval_public
    return f"data.eval_fraction={data.eval_fraction:g} of {Path(data.path).name}, split by protected unit", False


def held_out_table(data: DataSection, eval_path: Path | None = None, *, unit_key: str | None, seed: int):
    """The held-out records: ``eval_path`` if given, else the data section's ``eval_path`` or split.

    ``unit_key`` and ``seed`` are the contract's ``privacy.unit_key`` and ``training.seed``, which decide a
    ``data.eval_fraction`` split (:func:`dplora.data.units.split_eval`).

    Raises:
        BadInputError: no held-out set configured, or unreadable data.
    """
    from dplora.data import units as data_mod

    if eval_path is not None:
        update = data.model_copy(update={"eval_path": str(eval_path), "eval_fraction": None})
        return data_mod.load_table(data_mod.eval_data(update))
    if not data.has_eval_set:
        raise BadInputError(
            "no held-out set: the run's contract has no data.eval_path or data.eval_fraction; pass --eval-path FILE"
        )
    return data_mod.load_split(data, unit_key=unit_key, seed=seed)[1]


def evaluate_run(
    target: Path,
    *,
    eval_path: Path | None = None,
    threads: int | None = None,
    log=print,
    group_column: str | None = None,
    inputs: ReleaseInputs | None = None,
) -> Evaluation:
    """Evaluate the released adapters of ``target`` (a run folder or its contract) on the held-out set.

    The run's own ``contract.yaml`` decides the data, the split and the masking, so a ``data.eval_fraction``
    split is the same one training held out. ``group_column`` (default ``data.group_column``) adds per-group
    numbers. The data and base model are found where the release now is
    (:func:`dplora.release.locate.locate_inputs`: ``inputs`` given, else the contract's paths from here, else from
    the run folder's parent); the held-out set is still named by the contract's file names, never the given ones.

    Args:
        target: a run folder or its contract.
        eval_path: ``--eval-path``: a held-out file instead of the contract's.
        threads: CPU threads (default: the contract's, else the free ones).
        log: the one-line sink.
        group_column: ``--group-column``.
        inputs: ``--data``, ``--model`` and ``--data-key`` for a moved release.
    Raises:
        BadInputError: no release, no held-out set, data or model not found (naming the option to give), a given
            file that differs from the record's digest, unreadable data or model, a missing group column, or a
            ``group_column`` other than the contract's declared ``data.group_column``.
    """
    from dplora.release.locate import ReleaseInputs, locate_inputs
    from dplora.release.read import load_adapter_model, read_run

    run = read_run(target)
    declared = run.contract.data.group_column
    if group_column is not None and group_column != declared:  # by name only, never by looking at its values
        raise BadInputError(
            f"--group-column {excerpt(group_column, 60)}: only the column the run's contract declares as a public "
            f"label (data.group_column: {declared or 'none declared'}) can be reported per group; declare it there"
        )
    if eval_path is None and run.contract.data.eval_path is None and not run.contract.data.has_eval_set:
        # said before any file is looked for: --data would otherwise be refused as unused, a less useful line
        raise BadInputError(
            "no held-out set: the run's contract has no data.eval_path or data.eval_fraction; pass --eval-path FILE"
        )
    # the split reads data.path; a contract's own held-out file replaces it, and --eval-path replaces both
    reads_data = eval_path is None and run.contract.data.eval_path is None and run.contract.data.has_eval_set
    located = locate_inputs(run, inputs or ReleaseInputs(), data=reads_data, eval_file=eval_path is None, log=log)
    contract = located.contract
    table = held_out_table(contract.data, eval_path, unit_key=contract.privacy.unit_key, seed=contract.training.seed)
    source, public = held_out_source(run.contract.data, eval_path)  # the names trained on, never a given file's
    model, tokenizer, device = load_adapter_model(located, threads=threads, log=log)
    return evaluate_model(
        model,
        tokenizer,
        table,
        contract.data,
        contract.training,
        device=device,
        source=source,
        public=public,
        private_run=run.differentially_private,
        group_column=group_column,
    )
