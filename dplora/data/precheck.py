"""Fail fast: the contract's data files checked without torch or transformers, in about a second (``dplora validate
--check-files``; the public warm-start file at the start of ``dplora train``). The model's files are checked by
:mod:`dplora.engine.precheck`.

Only structure is read: the data file's header or schema (column names) and, for conversations, the shape of the
first record's conversation cell (a list of ``{role, content}``). Nothing printed is computed from the records'
values: no counts, lengths or text; a refusal names the file, the column and the expected keys.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from dplora.contract.labels import same_file
from dplora.contract.spec import DataSection
from dplora.data.chat import check_messages
from dplora.errors import BadInputError, excerpt, names_shown


def _first_sentence(err: BaseException) -> str:
    text = " ".join(str(err).split()) or err.__class__.__name__
    head = text.split(". ", 1)[0].rstrip(".")
    return head if len(head) <= 160 else head[:157] + "..."


def _columns(path: Path, builder: str, label: str) -> tuple[list[str], object]:
    """(column names, the first record's cells or None) from the file's header or schema only."""
    try:
        if builder == "csv":
            with open(path, newline="", encoding="utf-8-sig") as fh:  # a byte-order mark is fine, as in train
                header = next(csv.reader(fh), None)
            if not header:
                raise BadInputError(f"{label}: {path} has no header row")
            return list(header), None  # as train reads it (dplora.data.readers): names kept as written
        if builder == "parquet":
            import pyarrow.parquet as pq

            return list(pq.read_schema(path).names), None
        with open(path, encoding="utf-8-sig") as fh:
            if path.suffix.lower() == ".json":
                first = json.load(fh)
                first = first[0] if isinstance(first, list) and first else first
            else:
                line = next((ln for ln in fh if ln.strip()), None)
                if line is None:
                    raise BadInputError(f"{label}: {path} has no records")
                first = json.loads(line)
    except UnicodeDecodeError:
        raise BadInputError(f"{label}: {path} is not UTF-8") from None
    except (OSError, ValueError) as err:
        if isinstance(err, BadInputError):
            raise
        raise BadInputError(f"{label}: {path} cannot be read as {builder} ({err.__class__.__name__})") from None
    except Exception as err:  # noqa: BLE001 - pyarrow's own errors: not a parquet file
        raise BadInputError(f"{label}: {path} cannot be read as {builder} ({err.__class__.__name__})") from None
    if not isinstance(first, dict):
        raise BadInputError(f"{label}: {path}: the first record is not a JSON object with named fields")
    return list(first), first


def check_data_files(data: DataSection, unit_key: str | None, *, chat_template: bool | None) -> list[str]:
    """Check the data file (and ``data.eval_path``): it exists, its type, the contract's columns in its header or
    schema, and for conversations the first record's cell shape and the model's chat template.

    Args:
        data: the contract's data section; unit_key: ``privacy.unit_key``.
        chat_template: whether the model's tokenizer has a chat template (None: not known yet).
    Returns:
        ``OK  data: ...`` lines (column names only: the file's schema, never a value or a count).
    Raises:
        BadInputError: missing file, unknown type, a missing column, a conversation cell that is not a list of
            ``{role, content}``.
    """
    from dplora.data.units import dataset_builder, required_columns

    wanted = required_columns(data, unit_key)
    lines = []
    for key, value in (("data.path", data.path), ("data.eval_path", data.eval_path)):
        if value is None:
            continue
        path = Path(value)
        if path.is_dir():
            raise BadInputError(f"{key}={excerpt(str(path), 200)} is a folder; give a csv, jsonl or parquet file")
        if not path.is_file():
            raise BadInputError(f"data file not found: {key}={path}")
        builder = dataset_builder(data, path)
        columns, first = _columns(path, builder, key)
        needed = [c for c in wanted if key == "data.path" or c != unit_key]
        needed += [c for c in (data.label_column, data.group_column) if c and key == "data.eval_path"]
        missing = [c for c in needed if c not in columns]
        if missing:
            shown = names_shown(columns)
            raise BadInputError(f"{key}: {path} has no column {missing[0]!r}; columns are: {shown}")
        kind = {"json": "jsonl" if path.suffix.lower() != ".json" else "json"}.get(builder, builder)
        line = f"OK  {key}: {path} ({kind}; columns {', '.join(needed)} present)"
        if data.messages_key is not None:
            shape = "{role, content}"
            if first is not None:
                cell = first[data.messages_key]
                check_messages(cell, 1, data.messages_key)
                if cell[0].get("role") is None:  # checked: a message without a role is ShareGPT's
                    shape = "ShareGPT {from, value}"
            line += f"; {data.messages_key} holds lists of {shape}"
        lines.append(line)
    if (warm := check_warm_start_file(data)) is not None:
        lines.append(warm)
    if data.messages_key is not None and chat_template is False:
        lines.append("note: the model has no chat template: conversations are rendered with dplora's plain template")
    return lines


def check_warm_start_file(data: DataSection) -> str | None:
    """Check ``data.public_warm_start.path`` before any data is read: a readable file that is neither the private
    ``data.path`` nor ``data.eval_path`` (compared by resolved path and file identity, never by content), with the
    training records' columns in its header or schema. None without a warm start.

    Nothing here reads the private file or a value of the public one (the header, the schema, the first record's
    conversation shape), so the exit code is a function of public inputs only.

    Returns:
        One ``OK  data.public_warm_start.path: ...`` line.
    Raises:
        BadInputError: one line naming ``data.public_warm_start.path``: missing, a folder, unreadable, the private
            file, an unknown type or a missing column.
    """
    from dplora.data.units import dataset_builder, required_columns

    warm = data.public_warm_start
    if warm is None:
        return None
    key = "data.public_warm_start.path"
    path = Path(warm.path)
    shown = excerpt(str(path), 200)
    for other_key, other in (("data.path", data.path), ("data.eval_path", data.eval_path)):
        if other is not None and same_file(path, Path(other)):
            raise BadInputError(
                f"{key}={shown} is the contract's {other_key}: the warm start trains without noise and is charged "
                "nothing, so it must be a separate public file, never the private data"
            )
    if path.is_dir():
        raise BadInputError(f"{key}={shown} is a folder; give a public csv, jsonl or parquet file")
    if not path.is_file():
        raise BadInputError(f"public warm-start file not found: {key}={shown}")
    try:
        with open(path, "rb"):
            pass
    except OSError as err:
        raise BadInputError(f"{key}={shown}: cannot read it ({err.strerror or err.__class__.__name__})") from None
    public = data.model_copy(update={"path": str(path), "format": "auto", "public_warm_start": None})
    try:
        builder = dataset_builder(public, path)
    except BadInputError:
        raise BadInputError(f"{key}={shown}: unknown file type; use .csv, .jsonl, .json or .parquet") from None
    columns, first = _columns(path, builder, key)
    needed = required_columns(public, None)
    missing = [c for c in needed if c not in columns]
    if missing:
        names = names_shown(columns)
        raise BadInputError(f"{key}: {path} has no column {missing[0]!r}; columns are: {names}")
    if data.messages_key is not None and first is not None:
        check_messages(first[data.messages_key], 1, data.messages_key)
    kind = {"json": "jsonl" if path.suffix.lower() != ".json" else "json"}.get(builder, builder)
    return (
        f"OK  {key}: {path} ({kind}; columns {', '.join(needed)} present; declared public: {warm.steps} noise-free "
        "warm-start steps, no ε charged)"
    )
