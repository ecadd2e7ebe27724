"""Prepare the "Customer Support on Twitter" (TWCS) sample as (customer tweet -> brand reply) pairs.

Source format: the Kaggle ``thoughtvector/customer-support-on-twitter`` ``twcs.csv`` as exported by
pandas (see ``/work/shared/data/twcs_customer_support_twitter/SOURCE.md``). Columns: an unnamed index,
``tweet_id``, ``author_id``, ``inbound`` (the strings ``True``/``False``), ``created_at``
(``"Tue Oct 31 22:10:47 +0000 2017"``), ``text``, ``response_tweet_id`` and ``in_response_to_tweet_id``
(a parent id written as a float, e.g. ``"3.0"``, or empty).

For customer-level differential privacy the privacy unit is the customer: ``customer_id`` is the
``author_id`` of the inbound (customer) tweet, so every pair of one customer shares a key.

The data is CC BY-NC-SA 4.0 and consists of real public tweets; never log or print its text.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import Counter
from datetime import datetime
from pathlib import Path

from dplora.data.demo import write_records
from dplora.errors import BadInputError

PAIR_COLUMNS = ("customer_id", "tweet_id", "message", "reply")
REQUIRED_COLUMNS = ("tweet_id", "author_id", "inbound", "created_at", "text", "in_response_to_tweet_id")
CREATED_AT_FORMAT = "%a %b %d %H:%M:%S %z %Y"


def read_twcs_rows(path: Path) -> list[dict[str, str]]:
    """Read a TWCS CSV export into raw rows, repairing bare carriage returns first.

    One row of the 5,000-row sample (tweet_id 3399) has bare ``\\r`` characters inside an unquoted
    field, which makes ``csv`` split it in two. The file is therefore read as bytes, decoded as
    UTF-8, every ``\\r`` replaced by a space, and only then parsed with ``csv.DictReader``.

    Args:
        path: Path to ``twcs.csv`` or a prefix of it (e.g. ``twcs_first5000.csv``).

    Returns:
        One dict per tweet, keyed by the CSV header, all values ``str``.

    Raises:
        BadInputError: If the file is missing, is not UTF-8, or lacks a required column.
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise BadInputError(f"TWCS file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise BadInputError(f"TWCS file {path} is not valid UTF-8 (byte offset {exc.start})") from None
    reader = csv.DictReader(io.StringIO(text.replace("\r", " "), newline=""))
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise BadInputError(f"TWCS file {path} lacks column(s): {', '.join(missing)}")
    return list(reader)


def _parent_id(raw: str, row_number: int) -> str | None:
    """Normalise ``in_response_to_tweet_id`` (``"3.0"`` -> ``"3"``); None when empty."""
    raw = (raw or "").strip()
    if not raw:
        return None
    try:
        return str(int(float(raw)))
    except ValueError:
        raise BadInputError(f"data row {row_number}: in_response_to_tweet_id is not a number") from None


def _created_at(raw: str, row_number: int) -> datetime:
    try:
        return datetime.strptime(raw.strip(), CREATED_AT_FORMAT)
    except ValueError:
        raise BadInputError(f"data row {row_number}: created_at does not match {CREATED_AT_FORMAT!r}") from None


def load_twcs_pairs(path: Path) -> list[dict[str, str]]:
    """Pair each customer tweet with the first brand reply to it.

    For every inbound tweet (``inbound == "True"``) the brand tweets (``inbound == "False"``) whose
    ``in_response_to_tweet_id`` equals its ``tweet_id`` are candidates; the earliest by
    ``created_at`` wins, ties broken by the smallest numeric ``tweet_id``. Customer tweets with no
    brand reply in the file are skipped. Pairs keep the file order of the customer tweets.

    Args:
        path: Path to a TWCS CSV export (see module docstring for the format).

    Returns:
        Rows with keys ``customer_id`` (the customer's ``author_id``), ``tweet_id`` (the customer
        tweet), ``message`` (customer text) and ``reply`` (brand text), all ``str``.

    Raises:
        BadInputError: If the file cannot be read or a row has a malformed id or timestamp.
    """
    rows = read_twcs_rows(path)
    first_reply: dict[str, tuple[datetime, int, str]] = {}
    for n, row in enumerate(rows, start=1):
        if row["inbound"].strip() != "False":
            continue
        parent = _parent_id(row["in_response_to_tweet_id"], n)
        if parent is None:
            continue
        try:
            key = (_created_at(row["created_at"], n), int(row["tweet_id"]), row["text"])
        except ValueError:
            raise BadInputError(f"data row {n}: tweet_id is not an integer") from None
        if parent not in first_reply or key[:2] < first_reply[parent][:2]:
            first_reply[parent] = key
    pairs = []
    for row in rows:
        if row["inbound"].strip() != "True":
            continue
        reply = first_reply.get(row["tweet_id"].strip())
        if reply is not None:
            pairs.append(
                {
                    "customer_id": row["author_id"].strip(),
                    "tweet_id": row["tweet_id"].strip(),
                    "message": row["text"],
                    "reply": reply[2],
                }
            )
    return pairs


def _nearest_rank(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile: the smallest value with at least ``q`` of the data at or below it."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def write_twcs_pairs(src: Path, dest: Path, *, overwrite: bool = False) -> dict:
    """Build TWCS pairs from ``src`` and write them to ``dest`` as ``.csv`` or ``.jsonl``.

    The write is atomic (temp file + ``os.replace``) and uses the same writer as
    :func:`dplora.data.demo.write_tickets`; columns are ``customer_id, tweet_id, message, reply``.

    Args:
        src: TWCS CSV export to read (never modified).
        dest: Output file ending in ``.csv`` or ``.jsonl``.
        overwrite: Replace an existing ``dest`` if True.

    Returns:
        ``{"path": str, "num_pairs": int, "num_customers": int, "records_per_customer":
        {"min": int, "median": float, "p95": int, "max": int}}``; ``p95`` is the nearest-rank
        95th percentile of pairs per customer.

    Raises:
        BadInputError: On unreadable input, no pairs found, a bad suffix, or an existing ``dest``
            without ``overwrite``.
    """
    pairs = load_twcs_pairs(src)
    if not pairs:
        raise BadInputError(f"no (customer tweet -> brand reply) pairs found in {src}")
    out = write_records(Path(dest), pairs, PAIR_COLUMNS, overwrite=overwrite)
    per = sorted(Counter(p["customer_id"] for p in pairs).values())
    return {
        "path": str(out),
        "num_pairs": len(pairs),
        "num_customers": len(per),
        "records_per_customer": {
            "min": per[0],
            "median": float(statistics.median(per)),
            "p95": _nearest_rank(per, 0.95),
            "max": per[-1],
        },
    }
