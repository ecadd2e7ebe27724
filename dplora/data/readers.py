"""Read a data file as written: every csv cell as text, no missing-value guessing; errors name a line, not a row.

pandas (under ``datasets``' csv builder) reads ``NaN``, ``NA``, ``null`` or ``None`` as a missing value by default;
support tickets contain such words as text. Here csv columns are read as strings (``datasets.Value("string")``
features) with ``na_filter=False``, so only a truly empty cell is empty. jsonl and parquet keep their own types
(a JSON ``null`` is empty, the string ``"null"`` is text).

Unreadable files are diagnosed with the standard library (:mod:`csv`, :mod:`json`): the first bad line and the
likely cause (encoding, column count, JSON syntax), never the line's content.
"""

from __future__ import annotations

import csv
import glob
import json
import logging
import tempfile
from pathlib import Path

from dplora.errors import BadInputError, excerpt

_UTF8 = "utf-8-sig"  # a byte-order mark at the start is fine


def read_table(path: Path, builder: str):
    """Load ``path`` with ``datasets`` (``builder``: csv, json or parquet) into memory.

    Returns:
        A ``datasets.Dataset``; csv columns are all strings.

    Raises:
        BadInputError: not UTF-8 text, a csv line with the wrong number of fields, a duplicate csv column, a
            jsonl line that is not a JSON object, or any other read failure (class name only).
    """
    import datasets

    datasets.disable_progress_bars()
    logging.getLogger("datasets").setLevel(logging.CRITICAL)  # its parse errors can quote rows: never log them
    kwargs = {}
    if builder in ("csv", "json"):
        _check_utf8(path)
    if builder == "csv":
        header = _check_csv(path)
        kwargs = {
            "features": datasets.Features({name: datasets.Value("string") for name in header}),
            "na_filter": False,  # no NaN/NA/null/None guessing: an empty cell reads as "" and is refused later
            "keep_default_na": False,
        }
    with tempfile.TemporaryDirectory(prefix="dplora-data-") as cache:
        try:
            return datasets.load_dataset(
                builder,
                data_files=_as_named(path, cache),
                split="train",
                cache_dir=cache,
                keep_in_memory=True,
                **kwargs,
            )
        except Exception as err:  # datasets/pyarrow raise many types; never echo their row contents
            if builder == "json":
                _check_jsonl(path)
            cause = err.__cause__ or err.__context__ or err
            raise BadInputError(
                f"cannot read {path} as {builder}: {err.__class__.__name__} ({cause.__class__.__name__})"
            ) from None


_PLAIN_SUFFIXES = (".csv", ".jsonl", ".json", ".parquet")


def _as_named(path: Path, folder: str) -> str:
    """A ``data_files`` entry that makes ``datasets`` read ``path`` and nothing else: a link with a plain name
    (``data`` and the file's suffix) in the private temporary ``folder``, glob-escaped.

    ``datasets`` resolves ``data_files`` as an fsspec pattern, never as a plain name: ``[t]ickets.csv`` reads
    ``tickets.csv`` instead of itself, ``tick*.csv`` or ``ticket?.csv`` read ``tickets.csv`` beside it, a relative
    ``file:tickets.csv`` reads ``tickets.csv``, and ``a.csv::/x/b.csv`` reads ``a.csv``; the checks, digests and the
    warm start's refusal of the private file all describe ``path`` itself."""
    suffix = path.suffix.lower() if path.suffix.lower() in _PLAIN_SUFFIXES else ""
    link = Path(folder) / "named" / f"data{suffix}"
    link.parent.mkdir()
    link.symlink_to(path.absolute())
    return glob.escape(str(link))


class TextTable:
    """An in-memory table of text columns with the ``datasets.Dataset`` members the unit count reads.

    ``num_rows``, ``column_names``, ``table[column]`` (a list of str) and ``select(rows)``: what
    :func:`dplora.data.units.split_eval` and :func:`~dplora.data.units.build_unit_index` use. Built by
    :func:`read_csv_text` for ``dplora budget``, which must not pay for importing ``datasets`` (1.4 s here).
    """

    def __init__(self, columns: dict[str, list[str]]):
        self._columns = columns
        self.column_names = list(columns)
        self.num_rows = len(next(iter(columns.values()))) if columns else 0

    def __getitem__(self, column: str) -> list[str]:
        return self._columns[column]

    def __len__(self) -> int:
        return self.num_rows

    def select(self, rows) -> TextTable:
        """The rows at ``rows`` (indices into this table), in that order."""
        rows = [int(i) for i in rows]
        return TextTable({name: [values[i] for i in rows] for name, values in self._columns.items()})


def read_csv_text(path: Path) -> TextTable:
    """Read a csv file as :func:`read_table` reads it (every cell text as written), with the standard library only.

    The same checks run first (UTF-8, header, field counts); then the records as :mod:`csv` parses them, with
    pandas' blank-line rule (a line of only whitespace outside quotes is skipped, as ``skip_blank_lines``). A test
    checks the cells equal :func:`read_table`'s on tricky files (quoted line breaks, ``NaN``/``null`` text, a
    byte-order mark, blank lines, an empty header cell).

    Returns:
        A :class:`TextTable`, one row per record, columns in header order.

    Raises:
        BadInputError: as :func:`read_table` for csv.
    """
    _check_utf8(path)
    header = _check_csv(path)
    rows: list[list[str]] = []
    raw: list[str] = []
    with open(path, encoding=_UTF8, newline="") as fh:

        def lines():
            for line in fh:
                raw.append(line)
                yield line

        reader = csv.reader(lines())
        first = True
        for record in reader:
            text = "".join(raw)
            raw.clear()
            if not record or (len(record) == 1 and '"' not in text and not text.strip()):
                continue  # pandas skips blank and whitespace-only lines
            if first:
                first = False
                continue  # the header (checked by _check_csv)
            rows.append(record)
    return TextTable({name: [r[i] for r in rows] for i, name in enumerate(header)})


def _check_utf8(path: Path) -> None:
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            try:
                line.decode(_UTF8 if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise BadInputError(
                    f"data file {path}: line {number} is not UTF-8 (byte {err.start + 1} of the line); the file is "
                    "likely Latin-1 or Windows-1252: save it as UTF-8"
                ) from None


def _check_csv(path: Path) -> list[str]:
    """The header's column names; every record must have as many fields (quoted line breaks allowed)."""
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))  # long cells are fine (pandas has no limit)
    with open(path, encoding=_UTF8, newline="") as fh:
        reader = csv.reader(fh)
        header: list[str] | None = None
        end = 0
        try:
            for record in reader:
                start, end = end + 1, reader.line_num
                if not record:  # a blank line; pandas skips it too
                    continue
                if header is None:
                    header = _header(path, record)
                elif len(record) != len(header):
                    if start != end:
                        where, cause = f"the record on lines {start}-{end} has", "likely an unbalanced quote"
                    elif len(record) > len(header):
                        where, cause = f"line {start} has", "likely a comma inside a cell that is not quoted"
                    else:
                        where, cause = f"line {start} has", "likely a missing field"
                    raise BadInputError(
                        f"data file {path}: {where} {len(record)} fields but the header has {len(header)} ({cause})"
                    )
        except csv.Error:
            raise BadInputError(
                f"data file {path}: cannot parse line {reader.line_num} as csv (likely an unbalanced quote)"
            ) from None
    return header or []


def _header(path: Path, record: list[str]) -> list[str]:
    names = [name or f"Unnamed: {i}" for i, name in enumerate(record)]  # pandas' name for an empty header cell
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise BadInputError(f"data file {path}: column {excerpt(name)} appears twice in the header (line 1)")
        seen.add(name)
    return names


def _check_jsonl(path: Path) -> None:
    """Name the first jsonl line that is not one JSON object, or the first column whose JSON type changes."""
    kinds: dict[str, tuple[str, int]] = {}
    with open(path, encoding=_UTF8) as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise BadInputError(
                    f"data file {path}: line {number} is not valid JSON ({err.msg} at column {err.colno}); "
                    "jsonl needs one JSON object per line"
                ) from None
            if not isinstance(obj, dict):
                raise BadInputError(f"data file {path}: line {number} is not a JSON object (jsonl: one per line)")
            for key, value in obj.items():
                kind = _json_kind(value)
                first = kinds.setdefault(key, (kind, number))
                if kind != "null" and first[0] == "null":
                    kinds[key] = (kind, number)
                elif kind not in ("null", first[0]):
                    raise BadInputError(
                        f"data file {path}: column {excerpt(key)} holds {kind} on line {number} but {first[0]} on line "
                        f"{first[1]}; give each column one JSON type"
                    )


def _json_kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    return "a list" if isinstance(value, list) else "an object"
