"""A data file's shape from its structure only: column names and column types, never values or counts.

Used by ``data.record_format: auto`` (when the contract names no column) and by ``dplora init``. What is read: a csv
file's header; the keys, the JSON type of each value (text or a list) and, for a list of objects, the object keys
that every jsonl record shares; a parquet file's schema. Nothing computed from the records' values (no value, no
count, no length) is read, so the shape is a function of the file's schema: jsonl columns hold one JSON type in
the whole file (:func:`dplora.data.readers._check_jsonl` refuses a column whose type changes), so a neighbouring
file (one unit's records removed) has the same shape, unless that unit is the only one lacking a key.

Shapes detected, in this order (the first that fits):

========================  =======================================  ===========================================
file has                  shape                                    contract keys
========================  =======================================  ===========================================
``messages`` (list)       conversations, ``{role, content}``        (the default: ``messages_column: messages``)
``conversations`` (list)  ShareGPT (axolotl), ``{from, value}``     ``messages_column: conversations``
``prompt`` + ``completion``  TRL conversational prompt/completion   ``messages_column: prompt``,
(lists)                                                             ``completion_column: completion``
``prompt`` + ``completion``  TRL standard prompt/completion         ``prompt_column: prompt``,
(text)                                                              ``response_column: completion``
========================  =======================================  ===========================================

Source: TRL "Dataset formats and types" (prompt-completion, conversational), axolotl ``sharegpt`` (``conversations``).
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

SUFFIX_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


@dataclasses.dataclass(frozen=True)
class Structure:
    """A data file's structure.

    Attributes:
        format: ``csv``, ``jsonl`` or ``parquet``.
        columns: column name → ``text``, ``list`` or ``other`` (a number, an object, ...), in file order.
        turn_keys: for a ``list`` column whose first record holds objects: the keys of its first object (e.g.
            ``("role", "content")`` or ``("from", "value")``); jsonl only (a parquet schema gives the struct's fields).
    """

    format: str
    columns: dict[str, str]
    turn_keys: dict[str, tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class Shape:
    """A detected record shape: its name for people and the ``data`` keys that read it (empty: the defaults)."""

    name: str
    keys: dict[str, str]


def read_structure(path: Path, fmt: str = "auto", *, every_record: bool = False) -> Structure | None:
    """The structure of the data file at ``path`` (``fmt``: ``data.format``), or None when it cannot be read.

    Reads the csv header, the first non-blank jsonl line, or the parquet schema; never more of the records. With
    ``every_record`` (``dplora init``), a jsonl file's structure is the keys that every record has with a non-null
    value, and the keys that every object in a list column has (:func:`_jsonl_common_structure`), so that one
    unit's extra key cannot decide it; csv and parquet files have one header or schema for all records anyway.

    Returns:
        A :class:`Structure`, or None (no file, an unknown suffix, an unreadable first record, or with
        ``every_record`` any unreadable record: the data reader reports those later with its own one-line errors).
    """
    path = Path(path)
    fmt = SUFFIX_FORMATS.get(path.suffix.lower()) if fmt == "auto" else fmt
    try:
        if fmt == "csv":
            with open(path, encoding="utf-8-sig", newline="") as fh:
                header = next(csv.reader(fh), None)
            return Structure("csv", {name: "text" for name in header or []}, {}) if header else None
        if fmt == "jsonl":
            return _jsonl_common_structure(path) if every_record else _jsonl_structure(path)
        if fmt == "parquet":
            return _parquet_structure(path)
    except (OSError, UnicodeDecodeError, csv.Error, ValueError, ImportError):
        return None
    return None


def _kind(value) -> str:
    if isinstance(value, str):
        return "text"
    return "list" if isinstance(value, list) else "other"


def _records(path: Path):
    """The file's records in order: a JSON array's items (a ``.json`` file as ``train`` reads it), else one JSON
    value per non-blank line (jsonl)."""
    with open(path, encoding="utf-8-sig") as fh:
        head = fh.read(4096).lstrip()
        fh.seek(0)
        if path.suffix.lower() == ".json" and head.startswith("["):
            items = json.load(fh)
            yield from items if isinstance(items, list) else ()
            return
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _jsonl_structure(path: Path) -> Structure | None:
    first = next(_records(path), None)
    if first is None:
        return None
    if not isinstance(first, dict):
        return None
    turns = {k: tuple(v[0]) for k, v in first.items() if isinstance(v, list) and v and isinstance(v[0], dict)}
    return Structure("jsonl", {str(k): _kind(v) for k, v in first.items()}, turns)


def _jsonl_common_structure(path: Path) -> Structure | None:
    """The keys that every record of the jsonl file has with a non-null value, in name order, each with its kind
    (``other`` when records disagree: a file the data reader refuses); for a list column, the keys that every object
    in it has, over all records. Names and JSON types only, never a value, a length or a count.

    Why every record: exporters often omit empty fields, so the first record's keys (or any one unit's) may hold a
    key the others lack, and a contract built from them would change when that unit is removed. Built from the
    keys all records share, it changes only when the removed unit is the only one lacking a key (or a turn key),
    or the only one holding objects in a list column. Name order, not file order, for the same reason.
    """
    columns: dict[str, set[str]] | None = None
    turns: dict[str, set[str]] = {}
    for record in _records(path):
        if not isinstance(record, dict):
            return None
        kinds = {str(k): _kind(v) for k, v in record.items() if v is not None}
        if columns is None:
            columns = {k: {kind} for k, kind in kinds.items()}
        else:
            columns = {k: seen | {kinds[k]} for k, seen in columns.items() if k in kinds}
        for k, v in record.items():
            for item in v if isinstance(v, list) else ():
                if isinstance(item, dict):
                    keys = {str(name) for name in item}
                    turns[str(k)] = turns[str(k)] & keys if str(k) in turns else keys
    if columns is None:
        return None
    names = sorted(columns)
    kinds = {k: next(iter(columns[k])) if len(columns[k]) == 1 else "other" for k in names}
    return Structure("jsonl", kinds, {k: tuple(sorted(turns[k])) for k in names if k in turns})


def _parquet_structure(path: Path) -> Structure:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    columns, turns = {}, {}
    for field in schema:
        t = field.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            columns[field.name] = "text"
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            columns[field.name] = "list"
            if pa.types.is_struct(t.value_type):
                turns[field.name] = tuple(t.value_type.field(i).name for i in range(t.value_type.num_fields))
        else:
            columns[field.name] = "other"
    return Structure("parquet", columns, turns)


def detect_shape(structure: Structure) -> Shape | None:
    """The record shape that ``structure`` fits (module table), or None.

    Returns:
        A :class:`Shape`; ``keys`` are the ``data`` keys to set (``{}`` for the default ``messages`` column).
    """
    cols = structure.columns
    if cols.get("messages") == "list":
        return Shape("conversations ({role, content} messages)", {})
    if cols.get("conversations") == "list":
        keys = structure.turn_keys.get("conversations", ())
        name = "ShareGPT conversations ({from, value})" if "from" in keys else "conversations ({role, content})"
        return Shape(name, {"messages_column": "conversations"})
    if "prompt" in cols and "completion" in cols:
        if cols["prompt"] == "list" and cols["completion"] == "list":
            return Shape(
                "TRL conversational prompt/completion (message lists)",
                {"messages_column": "prompt", "completion_column": "completion"},
            )
        if cols["prompt"] == "text" and cols["completion"] == "text":
            return Shape("TRL prompt/completion (text)", {"prompt_column": "prompt", "response_column": "completion"})
    return None


COLUMN_KEYS = ("text_column", "prompt_column", "response_column", "messages_column", "completion_column")


def resolve_auto(contract):
    """``contract`` with ``data.record_format: auto`` resolved from the data file's structure, when it names no column.

    The structure is the keys and value types that every record has (:func:`read_structure` with
    ``every_record``): the resolved contract does not change when a unit is removed, unless that unit is the only
    one lacking a key another record has (then its removal can add the key).

    A contract that names a column, sets another record format, or whose file has a ``messages`` column or cannot
    be read is returned unchanged (the data reader then reports a missing file or column). The resolved keys go
    into the resolved contract (and so into a release's ``contract.yaml``): they are column names, structure only.

    Returns:
        The :class:`dplora.contract.spec.Contract`, possibly with ``data`` column keys filled in.
    """
    data = contract.data
    if data.record_format != "auto" or any(getattr(data, k) is not None for k in COLUMN_KEYS):
        return contract
    # the keys every record has (as `dplora init` reads them), never the first record's alone: with records whose
    # key sets differ, removing the first record's unit must not change the resolved (signed) contract
    structure = read_structure(Path(data.path), data.format, every_record=True)
    shape = detect_shape(structure) if structure is not None else None
    if shape is None or not shape.keys:
        return contract
    section = type(data).model_validate(data.model_dump() | shape.keys)
    return type(contract).model_validate(contract.model_dump() | {"data": section.model_dump()})
