"""Named errors of dplora, each carrying the documented process exit code.

| exit code | error class            | meaning                                        |
|-----------|------------------------|------------------------------------------------|
| 2         | ``BadInputError``      | bad input (contract, data, model path, keys)   |
| 2         | ``PlanRefusedError``   | a plan that cannot meet its contract or a cap  |
| 3         | ``VerificationError``  | ``dplora verify`` found a mismatch             |
| 4         | ``TrainingFailedError``| a sanity check or a non-finite loss in training |
| 4         | ``UncoveredParameterError`` | a trainable tensor no per-example path covers |
| 5         | (``dplora audit``)     | an audit found a violation (``verify``: its attached audit did) |
| 6         | ``NotPrivateError``    | a non-private run without ``--allow-non-private`` (verify, generate, synth) |
| 130       | (``KeyboardInterrupt``) | interrupted: Ctrl-C or SIGTERM                |

Exit code 1 is left to unexpected internal errors (a bug), which the CLI reports without a traceback.
Messages are one line and never contain raw training text; :func:`excerpt` bounds any input a message quotes and
:func:`one_line` makes the final line safe to print (no line breaks or control characters, at most
``MAX_MESSAGE_CHARS``).
"""

from __future__ import annotations

import re


class DploraError(Exception):
    """Base class: a one-line, user-facing message plus an exit code (and the longest line the CLI prints of it)."""

    exit_code: int = 1
    max_chars: int = 600  # MAX_MESSAGE_CHARS


class BadInputError(DploraError):
    """The contract, a data file, a model path or a key is invalid (exit code 2)."""

    exit_code = 2


class UnknownKeysError(BadInputError):
    """A contract with unknown keys (often another tool's config): the line names every key, never cut, since the
    user needs all of them at once and a contract file is bounded (64 KiB of key names)."""

    max_chars = 1_000_000


class PlanRefusedError(DploraError):
    """The plan cannot meet the contract: target ε unreachable, cap exceeded (exit code 2)."""

    exit_code = 2


class UnsupportedAccountingError(PlanRefusedError):
    """The chosen accountant cannot account this mechanism (e.g. RDP with replace-one)."""


class VerificationError(DploraError):
    """A release record's signature or a digest does not match (exit code 3)."""

    exit_code = 3


class TrainingFailedError(DploraError):
    """Training stopped: a sanity check failed or the loss became non-finite (exit code 4)."""

    exit_code = 4


class NoisyUpdateError(TrainingFailedError):
    """A trainable tensor became non-finite after a noisy update: the one stop rule, read from DP outputs only.
    The steps the run took are charged, even those after its last checkpoint (exit code 4)."""


class UncoveredParameterError(TrainingFailedError):
    """A trainable tensor that the chosen per-example gradient path does not cover (exit code 4)."""


class NotPrivateError(DploraError):
    """The run is a non-private control (no DP guarantee) and ``--allow-non-private`` was not given (exit code 6)."""

    exit_code = 6


EXCERPT_CHARS = 60  # the longest excerpt of one input value (a contract value, a key) that a message quotes
MAX_MESSAGE_CHARS = 600  # the longest error line the CLI prints, whatever it quotes


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` cut to at most ``limit`` characters (``...`` marks the cut); one line, control chars escaped.

    >>> excerpt("x" * 100, 10)
    "'xxxxxx..."
    """
    text = repr(value)
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")


def names_shown(names, limit: int = 200, *, quote: bool = False) -> str:
    """Column or key names for an error line: those that look like identifiers (a letter or ``_``, then letters,
    digits, ``_ . -``; at most 64 characters; surrounding spaces kept as written), joined (``quote``: as Python
    literals) and cut to ``limit`` characters, and a note when others were left out. A data file's keys come from
    its records: one record's stray key can be private text (a name, a number), which an error line (exit 2, a
    public job log) must not quote.

    >>> names_shown(["message", "reply", "Jane Doe 078-05-1120"])
    'message, reply and other names (not shown: not identifiers)'
    """
    names = [str(n) for n in names]
    shown = [n for n in names if _NAME.fullmatch(n.strip())]  # as written: a stray space is worth seeing
    text = ", ".join(repr(n) if quote else n for n in shown) or "none that are identifiers"
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text + (" and other names (not shown: not identifiers)" if len(shown) < len(names) else "")


def one_line(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``message`` as one printable line: line breaks, ANSI escapes, bidi controls and lone surrogates are written
    as Python escapes (``\\n``, ``\\x1b``, ``\\u202e``), and a longer line is cut to ``limit`` characters.

    >>> one_line("a\\nb")
    'a\\\\nb'
    """
    text = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in message)
    return text if len(text) <= limit else text[: limit - 3] + "..."
