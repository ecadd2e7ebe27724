"""A classification task's declared label set (``data.labels``, ``data.labels_file``, ``generate --choices``).

The label set is part of the contract, never collected from the data: a set read off the records would name a label
that only one protected unit carries, and `dplora init` never proposes one. Its checks use the contract (the list,
its bounds) and the label file's own lines and file identity only, so every refusal here is a function of public
inputs; a record whose label is outside the set is scored wrong by the evaluation, never refused.

The content-free input of contextual calibration (Zhao et al., ICML 2021, "Calibrate before use": the score vector
of a fixed input that carries no content, subtracted before the argmax) is :data:`DEFAULT_CALIBRATION_INPUT`, the
paper's "N/A", unless ``data.calibration_input`` declares another: a constant, never a record.
"""

from __future__ import annotations

import os
from pathlib import Path

from dplora.errors import BadInputError, excerpt

MAX_LABELS = 1000  # labels per set: Banking77 has 77 intents, CLINC150 150; a set past 1,000 is not a routing task
MAX_LABEL_CHARS = 200  # characters per label: an intent name, never a reply (a longer "label" is a free text)
MAX_CALIBRATION_CHARS = 1000  # data.calibration_input: a short content-free string
# Zhao et al. (ICML 2021) use "N/A" (also "" and "[MASK]") as the content-free input; one fixed string keeps the
# bias a function of the model, the adapters and the label set only.
DEFAULT_CALIBRATION_INPUT = "N/A"
# A labels file holds at most MAX_LABELS lines of MAX_LABEL_CHARS characters (4 UTF-8 bytes each) plus line ends.
MAX_LABELS_FILE_BYTES = MAX_LABELS * (4 * MAX_LABEL_CHARS + 2)


def label_set_problem(labels) -> str | None:
    """Why ``labels`` is not a usable label set, in words, or None when it is.

    A label set is 1 … :data:`MAX_LABELS` distinct labels, each printable text on one line of 1 …
    :data:`MAX_LABEL_CHARS` characters without surrounding whitespace (a reply is compared stripped).

    Args:
        labels: the labels, a sequence of str.

    Returns:
        None, or the first problem (naming a label by its 1-based position and a short excerpt, never a record).
    """
    if len(labels) == 0:
        return "an empty label set: declare at least one label"
    if len(labels) > MAX_LABELS:
        return f"{len(labels)} labels: at most {MAX_LABELS}"
    seen: dict[str, int] = {}
    for number, label in enumerate(labels, start=1):
        if not isinstance(label, str) or not label.strip():
            return f"label {number} is empty"
        if len(label) > MAX_LABEL_CHARS:
            return f"label {number} has {len(label)} characters: at most {MAX_LABEL_CHARS}"
        if not label.isprintable():
            return f"label {number} is not printable text on one line"
        if label != label.strip():
            return f"label {number} ({excerpt(label, 40)}) has surrounding whitespace"
        if label in seen:
            return f"label {number} ({excerpt(label, 40)}) repeats label {seen[label]}: labels must be distinct"
        seen[label] = number
    return None


def same_file(a: Path, b: str | Path | None) -> bool:
    """``a`` and ``b`` name the same file: equal resolved paths, or equal ``(st_dev, st_ino)`` (a link or a second
    name). Paths and file identities only, never contents."""
    if b is None:
        return False
    try:
        if Path(a).resolve() == Path(b).resolve():
            return True
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def read_labels_file(path: Path, *, option: str, private: dict[str, str | None] | None = None) -> tuple[str, ...]:
    """The labels of a public file: one label per non-empty line (UTF-8, surrounding whitespace stripped).

    Args:
        path: the file.
        option: how the caller named it (``data.labels_file``, ``--choices @FILE``), for messages.
        private: {contract key: path} of the private data files (``data.path``, ``data.eval_path``); ``path`` may be
            none of them, compared by resolved path and file identity (:func:`same_file`) before any byte is read.

    Returns:
        K labels in file order, checked by :func:`label_set_problem`.

    Raises:
        BadInputError: the private data file, missing, a folder, unreadable, not UTF-8, over
            :data:`MAX_LABELS_FILE_BYTES`, or a bad label set: one line naming ``option`` and the problem.
    """
    shown = f"{option} {excerpt(str(path), 200)}"
    for key, other in (private or {}).items():
        if same_file(Path(path), other):
            raise BadInputError(
                f"{shown} is the contract's {key} (private data): a label set is declared public, never read from "
                "the records; give a separate file with one label per line"
            )
    path = Path(path)
    if path.is_dir():
        raise BadInputError(f"{shown} is a folder; give a UTF-8 file with one label per line")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_LABELS_FILE_BYTES + 1)
    except OSError as err:
        raise BadInputError(f"{shown}: cannot read it ({err.strerror or err.__class__.__name__})") from None
    if len(raw) > MAX_LABELS_FILE_BYTES:
        raise BadInputError(f"{shown}: over {MAX_LABELS_FILE_BYTES} bytes; at most {MAX_LABELS} labels of ≤ 200 chars")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInputError(f"{shown}: not UTF-8 text") from None
    labels = tuple(line.strip() for line in text.splitlines() if line.strip())
    if (problem := label_set_problem(labels)) is not None:
        raise BadInputError(f"{shown}: {problem}")
    return labels


def parse_choices(value: str, *, private: dict[str, str | None] | None = None) -> tuple[str, ...]:
    """The labels of ``generate --choices``: a comma-separated list (each label stripped), or ``@FILE`` (one label
    per line, :func:`read_labels_file`; for labels that hold a comma).

    Args:
        value: the option's text.
        private: as :func:`read_labels_file` (the run's data files: never read as a label set).

    Returns:
        K labels, checked by :func:`label_set_problem`.

    Raises:
        BadInputError: an empty, duplicate or over-long set, or a bad file: one line.
    """
    if value.startswith("@"):
        return read_labels_file(Path(os.path.expanduser(value[1:])), option="--choices @FILE", private=private)
    labels = tuple(part.strip() for part in value.split(","))
    if (problem := label_set_problem(labels)) is not None:
        raise BadInputError(f"--choices: {problem}")
    return labels


def declared_labels(data) -> tuple[str, ...]:
    """The label set a classification contract declares: ``data.labels``, or the lines of ``data.labels_file``.

    Args:
        data: the contract's data section (``dplora.contract.spec.DataSection``) with ``task: classification``.

    Returns:
        K labels in declared order.

    Raises:
        BadInputError: no label set declared, or a labels file that is ``data.path`` or ``data.eval_path`` (by
            resolved path or file identity), unreadable or a bad set (:func:`read_labels_file`).
    """
    if data.labels is not None:
        if (problem := label_set_problem(data.labels)) is not None:
            raise BadInputError(f"data.labels: {problem}")
        return tuple(data.labels)
    if data.labels_file is None:
        raise BadInputError("data.task=classification needs a declared label set: data.labels or data.labels_file")
    private = {"data.path": data.path, "data.eval_path": data.eval_path}
    return read_labels_file(Path(data.labels_file), option="data.labels_file", private=private)
