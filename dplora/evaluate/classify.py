"""Classification by ranking a declared label set: length-normalised log-likelihood, contextual calibration optional.

A classification contract (``data.task: classification``) trains as any prompt/response contract: the label is the
response, the prompt masked. Evaluation and ``dplora generate --choices`` never generate; they rank the label
strings only. Each label is rendered as the response to the prompt exactly as a training record is
(:func:`dplora.data.tokens.tokenize_records`: the raw ``f"{prompt}\\n" + label + EOS`` or the model's chat template,
the same truncation), and scored by the mean log-probability of its target tokens (nats per token, EOS or the
template's end-of-turn included): the summed log-likelihood favours short labels, so one long label can get no
prediction at all.

Contextual calibration (Zhao et al., ICML 2021, "Calibrate before use"): the scores of a fixed content-free input
(:data:`dplora.contract.labels.DEFAULT_CALIBRATION_INPUT`, "N/A", or ``data.calibration_input``) measure the
model's prior for each label; that bias vector is subtracted before the argmax (in log space, the paper's
``W = diag(p_cf)^-1``; normalising p_cf over the labels adds one constant to every label and changes no argmax). The
bias is computed in forwards of its own, never batched with a record, so it is a function of the model, the
adapters, the label set and that input only: the same on neighbouring datasets.

Which scoring chooses (the headline accuracy, the recall, ``generate --choices``) is the contract's
``data.calibration``: ``none`` (the default) or ``contextual``; the evaluation reports both. The default is measured:
on Banking77 (N 554, ``docs/utility.md``) calibration lifts the untrained base from 0.317 to 0.700, the paper's
setting, where the model never saw the labels, and lowered all four fine-tuned adapters scored (by 3 to 27 points).

Each prompt's K label sequences are scored in batches of their own (never mixed with another prompt's), so a
prompt's scores are the same in ``dplora eval`` and in ``dplora generate --choices``.
"""

from __future__ import annotations

import dataclasses
import math

from dplora.contract.labels import DEFAULT_CALIBRATION_INPUT
from dplora.contract.spec import DataSection, TrainingSection
from dplora.evaluate.report import MIN_GROUP_RECORDS


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    """The chosen label for one prompt.

    Attributes:
        label: the label with the highest score (the first in declared order on a tie).
        scores: {label: score}, nats per token, in declared order: the length-normalised log-likelihood, minus the
            content-free bias where the contract declares ``data.calibration: contextual``.
    """

    label: str
    scores: dict[str, float]


def calibration_text(data: DataSection) -> str:
    """The content-free input: ``data.calibration_input``, else :data:`DEFAULT_CALIBRATION_INPUT` ("N/A")."""
    return data.calibration_input or DEFAULT_CALIBRATION_INPUT


def calibration(data: DataSection) -> str:
    """The contract's headline scoring: ``"contextual"`` (subtract the content-free bias) or ``"none"`` (the
    default: ``data.calibration`` absent)."""
    return data.calibration or "none"


def label_scores(
    model, tokenizer, prompt: str, labels, data: DataSection, training: TrainingSection, *, device, batch_size: int
) -> list[float]:
    """Length-normalised log-likelihood of each label as the response to ``prompt``, uncalibrated.

    Args:
        model: a causal LM (base, or base + adapters), in eval mode.
        prompt: one prompt as a record holds it (or the content-free input).
        labels: K labels.
        data, training: the contract's data section (prompt/response columns, chat template) and training section
            (``max_seq_len``): the record format of training.
        batch_size: label sequences per forward (the contract's physical batch size).

    Returns:
        K scores, nats per target token (≤ 0); −∞ for a label with no target token left after truncation.
    """
    import torch

    from dplora.data.tokens import tokenize_records
    from dplora.engine.batch import IGNORE_INDEX, collate, per_sequence_loss

    table = {data.prompt_column: [prompt] * len(labels), data.response_column: list(labels)}
    examples = tokenize_records(table, tokenizer, data, max_seq_len=training.max_seq_len)
    out = []
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            part = examples[start : start + batch_size]
            mean = per_sequence_loss(model, collate(part, tokenizer.pad_token_id, device=device)).double().tolist()
            for loss, (_, targets) in zip(mean, part, strict=True):  # the first token is never predicted
                out.append(-loss if any(y != IGNORE_INDEX for y in targets[1:]) else -math.inf)
    return out


def choose(labels, scores: list[float], bias: list[float] | None) -> Choice:
    """The argmax of ``scores − bias`` over ``labels`` (K each; ``bias`` None: uncalibrated, the scores as they are);
    ties go to the first label in declared order. A non-finite score or bias ranks last."""
    bias = [0.0] * len(labels) if bias is None else bias
    pairs = zip(scores, bias, strict=True)
    ranked = [s - b if math.isfinite(s) and math.isfinite(b) else -math.inf for s, b in pairs]
    best = max(range(len(labels)), key=lambda k: (ranked[k], -k))
    return Choice(label=labels[best], scores=dict(zip(labels, ranked, strict=True)))


def classify(
    model,
    tokenizer,
    prompts: list[str],
    labels,
    data: DataSection,
    training: TrainingSection,
    *,
    device,
    on_prompt=None,
) -> tuple[list[float], list[list[float]]]:
    """The content-free bias and every prompt's uncalibrated label scores (no gradient).

    Args:
        prompts: P prompts; labels: K labels (a checked label set).
        on_prompt: called with no argument after the bias and after each prompt (progress).

    Returns:
        (bias, scores): K floats from :func:`calibration_text` alone, and P lists of K floats, nats per token.
    """
    batch = training.fixed_physical_batch_size

    def score(prompt):
        out = label_scores(model, tokenizer, prompt, labels, data, training, device=device, batch_size=batch)
        if on_prompt is not None:
            on_prompt()
        return out

    bias = score(calibration_text(data))  # forwards of its own: never batched with a record
    return bias, [score(p) for p in prompts]


def choose_labels(
    model, tokenizer, prompts: list[str], labels, data: DataSection, training: TrainingSection, *, device
) -> list[Choice]:
    """The chosen label and scores of each prompt (``dplora generate --choices``), under the contract's
    ``data.calibration`` (:func:`calibration`).

    Returns:
        P :class:`Choice`, in prompt order; the same as the evaluation's headline gives for the same prompt.
    """
    bias, scores = classify(model, tokenizer, prompts, labels, data, training, device=device)
    contextual = calibration(data) == "contextual"
    return [choose(labels, s, bias if contextual else None) for s in scores]


def classification_stats(
    labels, gold: list[str], scores: list[list[float]], bias: list[float], *, calibration="none", min_records=None
):
    """Accuracy and per-label recall of one model on R held-out records (a pure function, no model).

    Args:
        labels: K declared labels.
        gold: R gold labels (the records' responses, stripped); one outside the set is scored wrong and counted.
        scores: R lists of K uncalibrated scores (:func:`classify`); bias: K content-free scores.
        calibration: ``"none"`` or ``"contextual"``: the scoring of ``accuracy`` and ``recall`` (the contract's
            ``data.calibration``); both scorings are reported beside.
        min_records: a label with fewer gold records is not shown (counted, as groups are); default
            :data:`dplora.evaluate.report.MIN_GROUP_RECORDS`.

    Returns:
        {"calibration", "accuracy" (under ``calibration``), "accuracy_uncalibrated", "accuracy_calibrated" (shares
        of R), "per_label": [{"label", "records", "recall" (under ``calibration``), "recall_uncalibrated",
        "recall_calibrated"}] for labels with ≥ min_records gold records, "hidden": {"labels", "records",
        "min_records"}, "bias": {label: nats/token}}.

    Raises:
        ValueError: ``calibration`` is neither ``"none"`` nor ``"contextual"``.
    """
    if calibration not in ("none", "contextual"):
        raise ValueError(f"calibration must be 'none' or 'contextual', not {calibration!r}")
    min_records = MIN_GROUP_RECORDS if min_records is None else min_records
    records = len(gold)
    right = {
        name: [choose(labels, s, b).label == y for s, y in zip(scores, gold, strict=True)]
        for name, b in (("uncalibrated", None), ("calibrated", bias))
    }
    chosen = "calibrated" if calibration == "contextual" else "uncalibrated"
    per_label, hidden_labels, hidden_records = [], 0, 0
    for label in labels:
        rows = [i for i, y in enumerate(gold) if y == label]
        if not rows:
            continue
        if len(rows) < min_records:
            hidden_labels, hidden_records = hidden_labels + 1, hidden_records + len(rows)
            continue
        recall = {name: sum(r[i] for i in rows) / len(rows) for name, r in right.items()}
        per_label.append(
            {"label": label, "records": len(rows), "recall": recall[chosen]}
            | {f"recall_{name}": value for name, value in recall.items()}
        )
    accuracy = {name: sum(r) / records if records else None for name, r in right.items()}
    return {
        "calibration": calibration,
        "accuracy": accuracy[chosen],
        "accuracy_uncalibrated": accuracy["uncalibrated"],
        "accuracy_calibrated": accuracy["calibrated"],
        "per_label": per_label,
        "hidden": {"labels": hidden_labels, "records": hidden_records, "min_records": min_records},
        "bias": dict(zip(labels, bias, strict=True)),
    }


def gold_labels(table, data: DataSection) -> list[str]:
    """Each held-out record's gold label: its response (the trained target), stripped of surrounding whitespace."""
    return ["" if y is None else str(y).strip() for y in table[data.response_column]]
