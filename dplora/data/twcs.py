"""Prepare the "Customer Support on Twitter" (TWCS) sample as (customer tweet -> brand reply) pairs.

Source format: the Kaggle ``thoughtvector/customer-support-on-twitter`` ``twcs.csv`` as exported by
pandas (see ``/work/shared/data/twcs_customer_support_twitter/SOURCE.md``). Columns: an unnamed index,
``tweet_id``, ``author_id``, ``inbound`` (the strings ``True``/``False``), ``created_at``
(``"Tue Oct 31 22:10:47 +0000 2017"``), ``text``, ``response_tweet_id`` and ``in_response_to_tweet_id``
(a parent id written as a float, e.g. ``"3.0"``, or empty).

For customer-level differential privacy the privacy unit is the customer: ``customer_id`` is the
``author_id`` of the inbound (customer) tweet, so every pair of one customer shares a key.

Reading the export, the brand rule, the tweet model and the redaction of mentions are in
:mod:`dplora.data.twcs_tweets`; this module builds the released records from them.

The data is CC BY-NC-SA 4.0 and consists of real public tweets; never log or print its text.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from pathlib import Path

from dplora.data.demo import write_records
from dplora.data.twcs_tweets import (
    DEFAULT_BRANDS,
    BrandRule,
    Tweet,
    read_twcs_rows,
    read_tweets,
    redact,
)
from dplora.errors import BadInputError

PAIR_COLUMNS = ("customer_id", "tweet_id", "message", "reply")


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
    tweets = read_tweets(read_twcs_rows(path), brands)
    first_reply: dict[str, Tweet] = {}
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
        message, answer = redact(t, keep, brands), redact(reply, keep, brands)
        stats["mentions_redacted"] += (message.text != t.text) + (answer.text != reply.text)
        pairs.append({"customer_id": t.author, "tweet_id": t.tweet_id, "message": message.text, "reply": answer.text})
    stats["pairs"] = len(pairs)
    return pairs


def nearest_rank(sorted_values: list[int], q: float) -> int:
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
            "p95": nearest_rank(per, 0.95),
            "max": per[-1],
        },
        "rule": dict(stats),
    }


CONVERSATION_COLUMNS = ("customer_id", "tweet_id", "messages")


def build_conversations(
    tweets: dict[str, Tweet], stats: Counter | None = None, *, brands: BrandRule = DEFAULT_BRANDS
) -> list[dict]:
    """Multi-turn conversations, one per reply thread, at customer level; see :func:`load_twcs_conversations`."""
    stats = Counter() if stats is None else stats
    children: dict[str, list[str]] = {}
    for t in tweets.values():
        if t.parent is not None and t.parent in tweets and t.parent != t.tweet_id:
            children.setdefault(t.parent, []).append(t.tweet_id)
    roots = [t for t in tweets.values() if t.parent is None or t.parent not in tweets]
    out = []  # brand-ness: ``t.inbound`` is False exactly for the rule's brands (checked per tweet in read_tweets)
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
        redacted = [redact(t, {customer.casefold()}, brands) for t in kept]  # rule 3: no other person's id
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


def _reaches_root(t: Tweet, tweets: dict[str, Tweet], kept: set[str], root: str) -> bool:
    """True when every tweet on the reply chain from ``t`` up to the thread's root is kept."""
    seen = set()
    while t.tweet_id != root:
        if t.tweet_id not in kept or t.tweet_id in seen or t.parent is None:
            return False
        seen.add(t.tweet_id)
        t = tweets[t.parent]
    return True


def _alternate(kept: list[Tweet], customer: str) -> list[dict[str, str]] | None:
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
    return build_conversations(read_tweets(read_twcs_rows(path), brands), stats, brands=brands)


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
        "turns_per_conversation": {q: nearest_rank(turns, p) for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}
        | {"max": turns[-1]},
        "rule": dict(stats),
    }
