"""The TWCS tweet model: reading the export, the public brand rule, tweets and the redaction of mentions.

Shared by the pair and the conversation builders of :mod:`dplora.data.twcs` (format: see that module). Everything
here is a function of one tweet's row, or of the public brand rule: no value is computed across customers except
the author-id case check, which refuses a file.

The data is CC BY-NC-SA 4.0 and consists of real public tweets; never log or print its text.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import html
import io
import re
import unicodedata
from datetime import datetime
from pathlib import Path

from dplora.errors import BadInputError

REQUIRED_COLUMNS = ("tweet_id", "author_id", "inbound", "created_at", "text", "in_response_to_tweet_id")
CREATED_AT_FORMAT = "%a %b %d %H:%M:%S %z %Y"


@dataclasses.dataclass(frozen=True)
class BrandRule:
    """Which ids are brands: a public input, never read from the data (customer-level neighbour-proofness).

    A customer's records must be a function of that customer's own tweets and of public inputs only: brand-ness
    decided from the file (an author with only outbound tweets) made customer A's ``@BrandY`` depend on whether
    customer B, the only one BrandY answered, was in the file. Two public rules:

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


def parent_id(raw: str, row_number: int) -> str | None:
    """Normalise ``in_response_to_tweet_id`` (``"3.0"`` -> ``"3"``); None when empty."""
    raw = (raw or "").strip()
    if not raw:
        return None
    whole = re.fullmatch(r"(\d+)(?:\.0*)?", raw)  # exact: a float would merge ids above 2**53 and read 1.9 as 1
    if whole is None:
        raise BadInputError(f"data row {row_number}: in_response_to_tweet_id is not a whole tweet id")
    return str(int(whole.group(1)))


def created_at(raw: str, row_number: int) -> datetime:
    try:
        return datetime.strptime(raw.strip(), CREATED_AT_FORMAT)
    except ValueError:
        raise BadInputError(f"data row {row_number}: created_at does not match {CREATED_AT_FORMAT!r}") from None


@dataclasses.dataclass(frozen=True)
class Tweet:
    tweet_id: str
    author: str
    inbound: bool
    text: str
    parent: str | None
    order: tuple[datetime, int]


def read_tweets(rows: list[dict[str, str]], brands: BrandRule) -> dict[str, Tweet]:
    tweets = {}
    for n, row in enumerate(rows, start=1):
        tid = row["tweet_id"].strip()
        try:
            order = (created_at(row["created_at"], n), int(tid))
        except ValueError:
            raise BadInputError(f"data row {n}: tweet_id is not an integer") from None
        if tid in tweets:  # the later row would silently replace the earlier tweet (and its author)
            raise BadInputError(f"data row {n}: tweet_id repeats an earlier row's; each tweet must appear once")
        parent = parent_id(row["in_response_to_tweet_id"], n)
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
        tweets[tid] = Tweet(tid, author, flag == "true", plain_text(row["text"]), parent, order)
    check_authors(tweets)
    return tweets


# Every format character (Unicode category Cf: soft hyphen, zero-width and bidi controls incl. U+2066-U+2069 and
# U+061C, tags U+E0000-U+E007F, U+FEFF, ...) plus the default-ignorable marks that are not Cf: the combining
# grapheme joiner U+034F, Hangul fillers, variation selectors U+FE00-U+FE0F and U+E0100-U+E01EF.
_IGNORABLE = "\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef"


@functools.cache
def invisible() -> re.Pattern:
    """The pattern of :data:`_IGNORABLE` and every Cf character, built on first use: scanning all 1,114,112 code
    points takes about 0.2 s, which every ``dplora`` command paid at import while only TWCS input needs it."""
    formats = "".join(chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf")
    return re.compile("[" + re.escape(formats) + _IGNORABLE + "]")


def plain_text(text: str) -> str:
    """NFKC-normalised (﹫ and ＠ become @) with invisible format characters removed, so no lookalike mention
    hides an id from :data:`MENTION`."""
    return invisible().sub("", unicodedata.normalize("NFKC", html.unescape(text)))


def check_authors(tweets: dict[str, Tweet]) -> None:
    """Refuse two author ids that differ only in case (Twitter handles are case-insensitive). An author with both
    inbound and outbound tweets is refused per tweet by :func:`read_tweets` (one of its flags contradicts the rule)."""
    folded: dict[str, str] = {}
    for t in tweets.values():
        other = folded.setdefault(t.author.casefold(), t.author)
        if other != t.author:
            raise BadInputError(f"tweet_id {t.tweet_id}: its author_id differs from another author's only in case")


MENTION = re.compile(r"@([\w.-]*\w)")  # after plain_text: ＠ and ﹫ are @; an id may hold . and - inside
OTHER_CUSTOMER = "@customer"  # what a mention of anyone but the unit's customer and the brands becomes


def redact(t: Tweet, keep: set[str], brands: BrandRule) -> Tweet:
    """``t`` with every mention that is neither in ``keep`` (case-folded ids: the unit's customer) nor a brand by
    the public rule replaced by :data:`OTHER_CUSTOMER`. A function of ``t``, ``keep`` and the rule only."""

    def one(m: re.Match) -> str:
        return m.group(0) if m.group(1).casefold() in keep or brands.is_brand(m.group(1)) else OTHER_CUSTOMER

    text = MENTION.sub(one, t.text)
    return t if text == t.text else dataclasses.replace(t, text=text)
