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


@dataclasses.dataclass(frozen=True)
class BrandRule:
    """Which ids are brands: a public input, never read from the data (customer-level neighbour-proofness).

    A customer's records must be a function of that customer's own tweets and of public inputs only: brand-ness
    decided from the file (an author with only outbound tweets) made customer A's ``@BrandY`` depend on whether
    customer B, the only one BrandY answered, was in the file (issue 41). Two public rules:

    - the default (``handles`` None), TWCS's own numbering: the corpus replaced every customer's handle with a
      number and kept the brands' handles, so an id whose first character is a decimal digit is a customer's and
      any other id is a brand's (on the shared 5,000-row sample it agrees with every ``inbound`` flag: 1,443
      numbered customers, 76 named brands). A handle that names a person without a number is kept as a brand;
    - ``handles``: a public list of brand handles (``--brands FILE``, :func:`load_brands`), compared
      case-insensitively; every other id is a customer's, so every other handle is redacted.

    Args:
        handles: the case-folded brand handles, or None for the numbering rule.
    """

    handles: frozenset[str] | None = None

    def is_brand(self, author_id: str) -> bool:
        """True when ``author_id`` (an author or a mention, without ``@``) is a brand's under this rule."""
        folded = unicodedata.normalize("NFKC", author_id).strip().casefold()
        if self.handles is None:
            return not folded[:1].isdecimal()
        return folded in self.handles

    def describe(self) -> str:
        """One public line naming the rule (for errors and the summary)."""
        if self.handles is None:
            return "TWCS's numbering rule (an id starting with a digit is a customer's)"
        return f"the --brands list ({len(self.handles)} handles)"


DEFAULT_BRANDS = BrandRule()
_HANDLE = re.compile(r"@?([\w.-]*\w)")


def load_brands(path: Path) -> BrandRule:
    """Read a public list of brand handles: one per line, an optional leading ``@``; blank lines and lines
    starting with ``#`` are ignored.

    Args:
        path: the list (UTF-8 text), e.g. the support accounts of the corpus.

    Returns:
        The :class:`BrandRule` of those handles (case-folded, NFKC-normalised).

    Raises:
        BadInputError: the file is missing or not UTF-8, a line is not one handle, or it lists no handle.
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise BadInputError(f"brands file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise BadInputError(f"brands file {path} is not valid UTF-8 (byte offset {exc.start})") from None
    handles = set()
    for n, line in enumerate(text.splitlines(), start=1):
        line = unicodedata.normalize("NFKC", line).strip()
        if not line or line.startswith("#"):
            continue
        match = _HANDLE.fullmatch(line)
        if match is None:
            raise BadInputError(f"brands file {path}: line {n} is not one handle (letters, digits, _ . -)")
        handles.add(match.group(1).casefold())
    if not handles:
        raise BadInputError(f"brands file {path} lists no handle")
    return BrandRule(frozenset(handles))


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


def load_twcs_pairs(path: Path, *, brands: BrandRule = DEFAULT_BRANDS, stats: Counter | None = None) -> list[dict]:
    """Pair each customer tweet with the first brand reply to it, redacted as conversations are.

    For every customer tweet the brand tweets (by ``brands``, a public rule) whose ``in_response_to_tweet_id``
    equals its ``tweet_id`` are candidates; the earliest by ``created_at`` wins, ties broken by the smallest
    numeric ``tweet_id``. Customer tweets with no brand reply in the file are skipped. Pairs keep the file order of
    the customer tweets. Both texts are normalised and redacted by the rule of :func:`load_twcs_conversations`
    (every ``@id`` but the pair's customer's and the brands' becomes ``@customer``), so a pair is a function of its
    customer's tweet, the brand's answer to it and the public rule: another customer's id never sits in it, and
    removing another customer changes none of it. Refused as in :func:`load_twcs_conversations`.

    Args:
        path: Path to a TWCS CSV export (see module docstring for the format).
        brands: the public brand rule (:class:`BrandRule`; default TWCS's numbering).
        stats: a Counter that receives ``pairs`` and ``mentions_redacted`` (private counts: operator only).

    Returns:
        Rows with keys ``customer_id`` (the customer's ``author_id``), ``tweet_id`` (the customer
        tweet), ``message`` (customer text) and ``reply`` (brand text), all ``str``.

    Raises:
        BadInputError: If the file cannot be read, a row has a malformed id or timestamp, or a refusal of
            :func:`load_twcs_conversations` applies.
    """
    stats = Counter() if stats is None else stats
    tweets = _tweets(read_twcs_rows(path), brands)
    first_reply: dict[str, _Tweet] = {}
    for t in tweets.values():
        if t.inbound or t.parent is None:
            continue
        if t.parent not in first_reply or t.order < first_reply[t.parent].order:
            first_reply[t.parent] = t
    pairs = []
    for t in tweets.values():
        if not t.inbound or (reply := first_reply.get(t.tweet_id)) is None:
            continue
        keep = {t.author.casefold()}
        message, answer = _redact(t, keep, brands), _redact(reply, keep, brands)
        stats["mentions_redacted"] += (message.text != t.text) + (answer.text != reply.text)
        pairs.append({"customer_id": t.author, "tweet_id": t.tweet_id, "message": message.text, "reply": answer.text})
    stats["pairs"] = len(pairs)
    return pairs


def _nearest_rank(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile: the smallest value with at least ``q`` of the data at or below it."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def write_twcs_pairs(src: Path, dest: Path, *, overwrite: bool = False, brands: BrandRule = DEFAULT_BRANDS) -> dict:
    """Build TWCS pairs from ``src`` and write them to ``dest`` as ``.csv`` or ``.jsonl``.

    The write is atomic (temp file + ``os.replace``) and uses the same writer as
    :func:`dplora.data.demo.write_tickets`; columns are ``customer_id, tweet_id, message, reply``.

    Args:
        src: TWCS CSV export to read (never modified).
        dest: Output file ending in ``.csv`` or ``.jsonl``.
        overwrite: Replace an existing ``dest`` if True.
        brands: the public brand rule (:class:`BrandRule`).

    Returns:
        ``{"path": str, "num_pairs": int, "num_customers": int, "records_per_customer":
        {"min": int, "median": float, "p95": int, "max": int}, "rule": {"mentions_redacted": int, ...}}``;
        ``p95`` is the nearest-rank 95th percentile of pairs per customer (all private counts: operator only).

    Raises:
        BadInputError: On unreadable input, no pairs found, a bad suffix, or an existing ``dest``
            without ``overwrite``.
    """
    stats: Counter = Counter()
    pairs = load_twcs_pairs(src, brands=brands, stats=stats)
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
        "rule": dict(stats),
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


def _tweets(rows: list[dict[str, str]], brands: BrandRule) -> dict[str, _Tweet]:
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
        if (flag == "true") == brands.is_brand(author):  # the flag and the public rule must agree, per tweet
            side, kind = ("inbound", "a brand") if flag == "true" else ("outbound", "a customer")
            raise BadInputError(
                f"tweet_id {tid}: {side}, but its author is {kind} by {brands.describe()}"
                + (": add the brand's handle to --brands" if brands.handles is not None and side == "outbound" else "")
            )
        tweets[tid] = _Tweet(tid, author, flag == "true", _plain(row["text"]), parent, order)
    _check_authors(tweets)
    return tweets


# Every format character (Unicode category Cf: soft hyphen, zero-width and bidi controls incl. U+2066-U+2069 and
# U+061C, tags U+E0000-U+E007F, U+FEFF, ...) plus the default-ignorable marks that are not Cf: the combining
# grapheme joiner U+034F, Hangul fillers, variation selectors U+FE00-U+FE0F and U+E0100-U+E01EF (issue 41 red team).
_IGNORABLE = "\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef"
_FORMAT = "".join(chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf")
INVISIBLE = re.compile("[" + re.escape(_FORMAT) + _IGNORABLE + "]")


def _plain(text: str) -> str:
    """NFKC-normalised (﹫ and ＠ become @) with invisible format characters removed, so no lookalike mention
    hides an id from :data:`MENTION`."""
    return INVISIBLE.sub("", unicodedata.normalize("NFKC", html.unescape(text)))


def _check_authors(tweets: dict[str, _Tweet]) -> None:
    """Refuse two author ids that differ only in case (Twitter handles are case-insensitive). An author with both
    inbound and outbound tweets is refused per tweet by :func:`_tweets` (one of its flags contradicts the rule)."""
    folded: dict[str, str] = {}
    for t in tweets.values():
        other = folded.setdefault(t.author.casefold(), t.author)
        if other != t.author:
            raise BadInputError(f"tweet_id {t.tweet_id}: its author_id differs from another author's only in case")


MENTION = re.compile(r"@([\w.-]*\w)")  # after _plain: ＠ and ﹫ are @; an id may hold . and - inside
OTHER_CUSTOMER = "@customer"  # what a mention of anyone but the unit's customer and the brands becomes


def _redact(t: _Tweet, keep: set[str], brands: BrandRule) -> _Tweet:
    """``t`` with every mention that is neither in ``keep`` (case-folded ids: the unit's customer) nor a brand by
    the public rule replaced by :data:`OTHER_CUSTOMER`. A function of ``t``, ``keep`` and the rule only."""

    def one(m: re.Match) -> str:
        return m.group(0) if m.group(1).casefold() in keep or brands.is_brand(m.group(1)) else OTHER_CUSTOMER

    text = MENTION.sub(one, t.text)
    return t if text == t.text else dataclasses.replace(t, text=text)


def build_conversations(
    tweets: dict[str, _Tweet], stats: Counter | None = None, *, brands: BrandRule = DEFAULT_BRANDS
) -> list[dict]:
    """Multi-turn conversations, one per reply thread, at customer level; see :func:`load_twcs_conversations`."""
    stats = Counter() if stats is None else stats
    children: dict[str, list[str]] = {}
    for t in tweets.values():
        if t.parent is not None and t.parent in tweets and t.parent != t.tweet_id:
            children.setdefault(t.parent, []).append(t.tweet_id)
    roots = [t for t in tweets.values() if t.parent is None or t.parent not in tweets]
    out = []  # brand-ness: ``t.inbound`` is False exactly for the rule's brands (checked per tweet in _tweets)
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
            if t.author == customer or not t.inbound:  # rule 1: only the unit's customer and brands
                kept.append(t)
            stack.extend(children.get(tid, []))
        thread_size = len(seen)
        kept_ids = {t.tweet_id for t in kept}
        kept = [t for t in kept if _reaches_root(t, tweets, kept_ids, root.tweet_id)]  # rule 3
        dropped = thread_size - len(kept)
        redacted = [_redact(t, {customer.casefold()}, brands) for t in kept]  # rule 3: no other person's id
        stats["mentions_redacted"] += sum(r.text != t.text for r, t in zip(redacted, kept, strict=True))
        kept = redacted
        stats["turns_dropped_by_rule"] += dropped
        stats["threads_touched_by_rule"] += dropped > 0
        messages = _alternate(sorted(kept, key=lambda t: t.order), customer)
        if messages is None:
            had_reply = any(not tweets[t].inbound for t in seen)
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


def load_twcs_conversations(
    path: Path, stats: Counter | None = None, *, brands: BrandRule = DEFAULT_BRANDS
) -> list[dict]:
    """One multi-turn conversation per reply thread, keyed by the customer who opened it (customer-level DP).

    Threads follow ``in_response_to_tweet_id`` from a root tweet (one with no parent in the file). The unit's
    customer is the root's author; a thread whose root is a brand tweet or answers a tweet missing from the file is
    dropped (its opener may be another customer's). PRIVACY RULE (no unit holds another unit's text, and a
    customer's records are a function of that customer's own tweets, the brands' answers in its threads and the
    public ``brands`` rule only, so removing another customer's conversation leaves them byte-identical):

    1. a tweet by any author other than the unit's customer or a brand is dropped, and so is every reply below it
       (a brand reply answering it may quote that customer). Brand-ness is the public :class:`BrandRule`
       (default: TWCS's numbering; or a ``--brands`` list), never read from other customers' tweets, and each
       tweet's ``inbound`` flag must agree with it;
    2. a tweet whose reply chain up to the root passes through a dropped tweet is dropped;
    3. in the tweets kept, every mention (``@id`` or ``＠id``, case-insensitive) of anyone but the unit's customer
       and the rule's brands becomes ``@customer`` -- also of people with no tweet in the file.

    Texts are HTML-unescaped and NFKC-normalised with invisible format characters removed first, so no lookalike
    ``@`` hides an id. What no rule can catch: a brand reply that quotes another person's words or names them
    without an ``@`` (and, under the numbering rule, a person named by a handle that is not a number). Refused
    (exit 2), never guessed: an ``inbound`` value other than True/False, a flag the brand rule contradicts (an
    inbound tweet by a brand, an outbound one by a customer: also an author with both), a repeated ``tweet_id``,
    an empty ``author_id``, two author ids that differ only in case, a parent id that is not a whole number, a
    malformed csv row (wrong field count, a quote left open) and a text cell holding a line shaped like a TWCS
    row (a quote that swallowed the rows below it).

    The tweets left, in ``created_at`` order (ties: smaller tweet_id), become turns: customer → ``user``, brand →
    ``assistant``; consecutive turns of one role are joined with a newline, trailing user turns are cut, and a
    thread left with no assistant turn is dropped. So every conversation starts with ``user``, alternates and ends
    with ``assistant``.

    Args:
        path: a TWCS CSV export.
        brands: the public brand rule (:class:`BrandRule`; default TWCS's numbering).
        stats: a Counter that receives ``threads``, ``conversations``, ``threads_touched_by_rule``,
            ``turns_dropped_by_rule``, ``threads_dropped_by_rule``, ``threads_dropped_no_brand_reply``,
            ``threads_dropped_no_customer_root``, ``mentions_redacted`` (private counts: operator only).

    Returns:
        Rows ``{"customer_id": str, "tweet_id": str (the root), "messages": [{"role", "content"}, ...]}``.

    Raises:
        BadInputError: unreadable or malformed file, malformed id or timestamp, and each refusal listed above.
    """
    return build_conversations(_tweets(read_twcs_rows(path), brands), stats, brands=brands)


def write_twcs_conversations(
    src: Path, dest: Path, *, overwrite: bool = False, brands: BrandRule = DEFAULT_BRANDS
) -> dict:
    """Build TWCS conversations (:func:`load_twcs_conversations`, under the public ``brands`` rule) and write them
    to ``dest`` (``.jsonl`` only).

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
    rows = load_twcs_conversations(src, stats, brands=brands)
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
