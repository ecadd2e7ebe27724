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
import dataclasses
import html
import io
import math
import re
import statistics
import unicodedata
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
    reader = csv.DictReader(io.StringIO(text.replace("\r", " "), newline=""), strict=True)
    width = len(reader.fieldnames or [])
    if reader.fieldnames:  # a CRLF file's last header name ends in the space its \r became
        reader.fieldnames = [name.strip() for name in reader.fieldnames]
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise BadInputError(f"TWCS file {path} lacks column(s): {', '.join(missing)}")
    try:
        rows = list(reader)
    except csv.Error as exc:  # e.g. a quote left open: it would join the rows below into one cell
        raise BadInputError(f"TWCS file {path}: malformed csv near line {reader.line_num} ({exc})") from None
    for n, row in enumerate(rows, start=1):
        if None in row or None in row.values():
            raise BadInputError(f"TWCS file {path}: data row {n} has {len(row) - (None in row)} fields, not {width}")
        if ROW_LIKE.search(row["text"]):  # a quoted cell that swallowed other rows (another customer's text)
            raise BadInputError(f"TWCS file {path}: data row {n}'s text holds a line shaped like a TWCS row")
    return rows


ROW_LIKE = re.compile(r"\n\s*\d*,\d+,[^,\n]*,(True|False),", re.IGNORECASE)


def _parent_id(raw: str, row_number: int) -> str | None:
    """Normalise ``in_response_to_tweet_id`` (``"3.0"`` -> ``"3"``); None when empty."""
    raw = (raw or "").strip()
    if not raw:
        return None
    whole = re.fullmatch(r"(\d+)(?:\.0*)?", raw)  # exact: a float would merge ids above 2**53 and read 1.9 as 1
    if whole is None:
        raise BadInputError(f"data row {row_number}: in_response_to_tweet_id is not a whole tweet id")
    return str(int(whole.group(1)))


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


CONVERSATION_COLUMNS = ("customer_id", "tweet_id", "messages")


@dataclasses.dataclass(frozen=True)
class _Tweet:
    tweet_id: str
    author: str
    inbound: bool
    text: str
    parent: str | None
    order: tuple[datetime, int]


def _tweets(rows: list[dict[str, str]]) -> dict[str, _Tweet]:
    tweets = {}
    for n, row in enumerate(rows, start=1):
        tid = row["tweet_id"].strip()
        try:
            order = (_created_at(row["created_at"], n), int(tid))
        except ValueError:
            raise BadInputError(f"data row {n}: tweet_id is not an integer") from None
        if tid in tweets:  # the later row would silently replace the earlier tweet (and its author)
            raise BadInputError(f"data row {n}: tweet_id repeats an earlier row's; each tweet must appear once")
        parent = _parent_id(row["in_response_to_tweet_id"], n)
        flag = row["inbound"].strip().lower()
        if flag not in ("true", "false"):  # never guess: an unknown flag read as "brand" would keep its text
            raise BadInputError(f"data row {n}: inbound must be True or False")
        author = row["author_id"].strip()
        if not author:
            raise BadInputError(f"data row {n}: author_id is empty")
        tweets[tid] = _Tweet(tid, author, flag == "true", _plain(row["text"]), parent, order)
    _check_authors(tweets)
    return tweets


INVISIBLE = re.compile("[\u00ad\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]")


def _plain(text: str) -> str:
    """NFKC-normalised (﹫ and ＠ become @) with invisible format characters removed, so no lookalike mention
    hides an id from :data:`MENTION`."""
    return INVISIBLE.sub("", unicodedata.normalize("NFKC", html.unescape(text)))


def _check_authors(tweets: dict[str, _Tweet]) -> None:
    """Refuse authors dplora cannot tell apart or classify: an author with both inbound and outbound tweets (brand
    or customer?), and two ids that differ only in case (Twitter handles are case-insensitive)."""
    flags: dict[str, set[bool]] = {}
    folded: dict[str, str] = {}
    for t in tweets.values():
        flags.setdefault(t.author, set()).add(t.inbound)
        other = folded.setdefault(t.author.casefold(), t.author)
        if other != t.author:
            raise BadInputError(f"tweet_id {t.tweet_id}: its author_id differs from another author's only in case")
    for t in tweets.values():
        if len(flags[t.author]) == 2:
            raise BadInputError(
                f"tweet_id {t.tweet_id}: its author has both inbound and outbound tweets (brand or customer?)"
            )


MENTION = re.compile(r"@([\w.-]*\w)")  # after _plain: ＠ and ﹫ are @; an id may hold . and - inside
OTHER_CUSTOMER = "@customer"  # what a mention of anyone but the unit's customer and the brands becomes


def _redact(t: _Tweet, keep: set[str]) -> _Tweet:
    """``t`` with every mention whose id (case-folded) is not in ``keep`` replaced by :data:`OTHER_CUSTOMER`."""
    text = MENTION.sub(lambda m: m.group(0) if m.group(1).casefold() in keep else OTHER_CUSTOMER, t.text)
    return t if text == t.text else dataclasses.replace(t, text=text)


def build_conversations(tweets: dict[str, _Tweet], stats: Counter | None = None) -> list[dict]:
    """Multi-turn conversations, one per reply thread, at customer level; see :func:`load_twcs_conversations`."""
    stats = Counter() if stats is None else stats
    children: dict[str, list[str]] = {}
    for t in tweets.values():
        if t.parent is not None and t.parent in tweets and t.parent != t.tweet_id:
            children.setdefault(t.parent, []).append(t.tweet_id)
    roots = [t for t in tweets.values() if t.parent is None or t.parent not in tweets]
    brands = {t.author for t in tweets.values() if not t.inbound}  # no author is both (_check_authors)
    brand_ids = {b.casefold() for b in brands}
    out = []
    for root in sorted(roots, key=lambda t: t.order):
        stats["threads"] += 1
        if not root.inbound or root.parent is not None:  # a brand opener or a reply to a tweet not in the file
            stats["threads_dropped_no_customer_root"] += 1
            continue
        customer = root.author
        kept, stack, seen = [], [root.tweet_id], set()
        while stack:  # walk the whole thread
            tid = stack.pop()
            if tid in seen:
                continue
            seen.add(tid)
            t = tweets[tid]
            if t.author == customer or t.author in brands:  # rule 1: only the unit's customer and brands
                kept.append(t)
            stack.extend(children.get(tid, []))
        thread_size = len(seen)
        kept_ids = {t.tweet_id for t in kept}
        kept = [t for t in kept if _reaches_root(t, tweets, kept_ids, root.tweet_id)]  # rule 3
        dropped = thread_size - len(kept)
        redacted = [_redact(t, brand_ids | {customer.casefold()}) for t in kept]  # rule 3: no other person's id
        stats["mentions_redacted"] += sum(r.text != t.text for r, t in zip(redacted, kept, strict=True))
        kept = redacted
        stats["turns_dropped_by_rule"] += dropped
        stats["threads_touched_by_rule"] += dropped > 0
        messages = _alternate(sorted(kept, key=lambda t: t.order), customer)
        if messages is None:
            had_reply = any(tweets[t].author in brands for t in seen)
            stats["threads_dropped_by_rule" if had_reply else "threads_dropped_no_brand_reply"] += 1
            continue
        out.append({"customer_id": customer, "tweet_id": root.tweet_id, "messages": messages})
    stats["conversations"] = len(out)
    return out


def _reaches_root(t: _Tweet, tweets: dict[str, _Tweet], kept: set[str], root: str) -> bool:
    """True when every tweet on the reply chain from ``t`` up to the thread's root is kept."""
    seen = set()
    while t.tweet_id != root:
        if t.tweet_id not in kept or t.tweet_id in seen or t.parent is None:
            return False
        seen.add(t.tweet_id)
        t = tweets[t.parent]
    return True


def _alternate(kept: list[_Tweet], customer: str) -> list[dict[str, str]] | None:
    """Turns in time order: customer → user, brand → assistant; consecutive turns of one role merged (newline),
    trailing user turns cut; None when no assistant turn is left."""
    messages: list[dict[str, str]] = []
    for t in kept:
        role = "user" if t.author == customer else "assistant"
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += "\n" + t.text
        else:
            messages.append({"role": role, "content": t.text})
    while messages and messages[-1]["role"] == "user":
        messages.pop()
    if not messages or messages[0]["role"] != "user":
        return None
    return messages


def load_twcs_conversations(path: Path, stats: Counter | None = None) -> list[dict]:
    """One multi-turn conversation per reply thread, keyed by the customer who opened it (customer-level DP).

    Threads follow ``in_response_to_tweet_id`` from a root tweet (one with no parent in the file). The unit's
    customer is the root's author; a thread whose root is a brand tweet or answers a tweet missing from the file is
    dropped (its opener may be another customer's). PRIVACY RULE (no unit holds another unit's text):

    1. a tweet by any author other than the unit's customer or a brand is dropped, and so is every reply below it
       (a brand reply answering it may quote that customer). A brand is an author whose tweets are all outbound
       (``inbound`` False); an author with any inbound tweet is a customer wherever it writes;
    2. a tweet whose reply chain up to the root passes through a dropped tweet is dropped;
    3. in the tweets kept, every mention (``@id`` or ``＠id``, case-insensitive) of anyone but the unit's customer
       and the brands becomes ``@customer`` -- also of people with no tweet in the file, so that one customer's
       record never depends on whether another customer's tweets are present.

    Texts are HTML-unescaped and NFKC-normalised with invisible format characters removed first, so no lookalike
    ``@`` hides an id. What no rule can catch: a brand reply that quotes another person's words or names them
    without an ``@``. Refused (exit 2), never guessed: an ``inbound`` value other than True/False, a repeated
    ``tweet_id``, an empty ``author_id``, an author with both inbound and outbound tweets, two author ids that
    differ only in case, a parent id that is not a whole number, a malformed csv row (wrong field count, a quote
    left open) and a text cell holding a line shaped like a TWCS row (a quote that swallowed the rows below it).

    The tweets left, in ``created_at`` order (ties: smaller tweet_id), become turns: customer → ``user``, brand →
    ``assistant``; consecutive turns of one role are joined with a newline, trailing user turns are cut, and a
    thread left with no assistant turn is dropped. So every conversation starts with ``user``, alternates and ends
    with ``assistant``.

    Args:
        path: a TWCS CSV export.
        stats: a Counter that receives ``threads``, ``conversations``, ``threads_touched_by_rule``,
            ``turns_dropped_by_rule``, ``threads_dropped_by_rule``, ``threads_dropped_no_brand_reply``,
            ``threads_dropped_no_customer_root``, ``mentions_redacted`` (private counts: operator only).

    Returns:
        Rows ``{"customer_id": str, "tweet_id": str (the root), "messages": [{"role", "content"}, ...]}``.

    Raises:
        BadInputError: unreadable or malformed file, malformed id or timestamp, and each refusal listed above.
    """
    return build_conversations(_tweets(read_twcs_rows(path)), stats)


def write_twcs_conversations(src: Path, dest: Path, *, overwrite: bool = False) -> dict:
    """Build TWCS conversations (:func:`load_twcs_conversations`) and write them to ``dest`` (``.jsonl`` only).

    Returns:
        ``{"path", "num_conversations", "num_customers", "turns_per_conversation": {"p50", "p90", "p99", "max"},
        "rule": {the private counts of :func:`load_twcs_conversations`}}``.

    Raises:
        BadInputError: unreadable input, no conversation, a suffix other than ``.jsonl``, an existing ``dest``
            without ``overwrite``.
    """
    if Path(dest).suffix.lower() != ".jsonl":
        raise BadInputError(f"{dest}: conversations are written as .jsonl (a csv cell cannot hold a list of turns)")
    stats: Counter = Counter()
    rows = load_twcs_conversations(src, stats)
    if not rows:
        raise BadInputError(f"no (customer -> brand) conversation found in {src}")
    out = write_records(Path(dest), rows, CONVERSATION_COLUMNS, overwrite=overwrite)
    turns = sorted(len(r["messages"]) for r in rows)
    return {
        "path": str(out),
        "num_conversations": len(rows),
        "num_customers": len({r["customer_id"] for r in rows}),
        "turns_per_conversation": {q: _nearest_rank(turns, p) for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}
        | {"max": turns[-1]},
        "rule": dict(stats),
    }
