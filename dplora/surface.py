"""The public surface of a command: what it may print or write where others see it, and where the rest goes.

**The rule.** Public output is a function of public inputs and of DP outputs only. Public inputs are the contract,
the declared N, the plan (q, T, σ, C, B), the model and code versions and the file names the user gave. Everything
a job can publish follows it: the signed record and the card, every ``--json`` document, stdout and stderr under
CI, tracker events and their file metadata, synth/export/audit manifests and ``ledger show``.

**Private diagnostics** — realised timings, empty steps, peak memory, record and truncation counts, numbers on a
private held-out set, memorisation counts, local data-count warnings — are computed on the private data and are
NOT covered by ε. They have one home, ``<output_dir>.private/`` (``train.log`` and ``report.json``), and reach the
terminal only when nobody else reads it: stderr is a terminal, ``CI`` is unset, the command was not started from a
Jupyter kernel (a notebook saves its cells' output and is shared as a file) and ``--json`` was not given
(``--show-private``, or ``DPLORA_SHOW_PRIVATE=1``, prints them anyway; the operator then owns that log).

A job log is public: a CI runner shows it to everyone who can read the job, and its own timestamps show the job's
wall time, which is itself a function of the private data (restrict who can read the logs, or accept that knowingly).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from dplora import atomic

SHOW_PRIVATE_ENV = "DPLORA_SHOW_PRIVATE"
LOG_FILENAME = "train.log"
REPORT_FILENAME = "report.json"
PREFIX = "private (not covered by DP): "
_FALSE = ("", "0", "false", "no", "off")


def in_ci() -> bool:
    """True when the ``CI`` environment variable is set to anything but empty/0/false/no/off (GitHub Actions,
    GitLab CI and most runners set ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() not in _FALSE


def in_notebook(env: Mapping[str, str] = os.environ) -> bool:
    """True in a process started from a Jupyter kernel: a notebook's ``!dplora ...`` (or ``subprocess`` in a cell).

    Such a process may well have a terminal: ipykernel runs ``!cmd`` on a pseudo-terminal (IPython's pexpect-based
    ``system`` on Linux and macOS), so ``isatty()`` is true, yet what it prints is saved in the ``.ipynb`` and
    shared with it. The kernel's children are told apart by the environment they inherit: jupyter_client sets
    ``JPY_PARENT_PID`` for the kernel it launches, and ipykernel itself sets ``TERM=xterm-color``, ``CLICOLOR=1``,
    ``PAGER=cat`` and ``GIT_PAGER=cat`` (``ZMQInteractiveShell.init_environment``), whoever launched it. A terminal
    that happens to look alike only loses the private echo (``--show-private`` restores it), never gains one.
    """
    if env.get("JPY_PARENT_PID", "").strip():
        return True
    kernel = {"TERM": "xterm-color", "CLICOLOR": "1", "PAGER": "cat", "GIT_PAGER": "cat"}
    return all(env.get(k) == v for k, v in kernel.items())


def echo_private(*, as_json: bool = False, show_private: bool = False, stream=None) -> bool:
    """Whether private diagnostics may be printed on ``stream`` (default stderr).

    True with ``show_private`` (``--show-private``) or ``$DPLORA_SHOW_PRIVATE`` set; else only when ``stream`` is
    an interactive terminal, ``CI`` is unset, no Jupyter kernel started the process (:func:`in_notebook`) and no
    ``--json`` document was asked for.
    """
    if show_private or os.environ.get(SHOW_PRIVATE_ENV, "").strip().lower() not in _FALSE:
        return True
    if as_json or in_ci() or in_notebook():
        return False
    isatty = getattr(stream if stream is not None else sys.stderr, "isatty", None)
    return bool(isatty is not None and isatty())


def private_notice(where: str, what: str = "held-out numbers, data notes") -> str:
    """The one line a command prints where it withholds private diagnostics (off a terminal, under CI, ``--json``).

    It is printed on every such run, whether or not anything was withheld, and holds no count, name or value: its
    presence and its bytes depend on the command, its options and the output path only, never on the data (a line
    that appeared only when something was withheld would itself tell neighbouring datasets apart).

    Args:
        where: the file that holds them, or a phrase where the command writes none.
        what: what kind of diagnostics the command keeps there (fixed per command).
    """
    return f"private diagnostics ({what}; NOT covered by DP): {where}; --show-private prints them"


class PrivateLog:
    """The sink of a run's private diagnostics: one-line messages (``train.log``) and numbers (``report.json``).

    Lines are kept in memory until :meth:`attach` names the run's private folder, then written there (appended:
    a resumed run keeps the earlier session's lines). They are echoed, prefixed :data:`PREFIX`, through ``echo``
    when one is given (the CLI passes one only when :func:`echo_private` allows it).

    Args:
        echo: a one-line sink (the CLI's stderr log), or None to keep everything in the private folder only.
        filename: the log file's name inside the folder (``train.log``; ``synth.log`` for synth, …).
    """

    def __init__(self, echo: Callable[[str], None] | None = None, *, filename: str = LOG_FILENAME):
        self._echo, self._filename = echo, filename
        self._pending: list[str] = []
        self.folder: Path | None = None
        self.report: dict = {}

    @property
    def echoing(self) -> bool:
        """True when messages are also printed (an interactive operator, or ``--show-private``)."""
        return self._echo is not None

    def __call__(self, message: str) -> None:
        """Record one private line (never training text: counts, numbers and file names only)."""
        line = PREFIX + message
        if self._echo is not None:
            self._echo(line)
        self._pending.append(line)
        self._flush()

    def put(self, **values) -> None:
        """Add numbers to ``report.json`` (seconds, counts, losses: JSON-serialisable values)."""
        self.report.update(values)
        self._flush()

    def attach(self, folder: Path) -> None:
        """Write what was recorded so far, and everything after, into ``folder`` (created if missing)."""
        self.folder = Path(folder)
        self._flush()

    def _flush(self) -> None:
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._pending:
            path = self.folder / self._filename
            old = path.read_text() if path.is_file() else ""
            atomic.write_text(path, old + "".join(line + "\n" for line in self._pending))
            self._pending.clear()
        if self.report:
            path = self.folder / REPORT_FILENAME
            old = json.loads(path.read_text()) if path.is_file() else {}
            atomic.write_text(path, json.dumps({**old, **self.report}, indent=2, sort_keys=True) + "\n")
