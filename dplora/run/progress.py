"""Training progress on stderr: a rich bar on an interactive terminal, public plain lines otherwise (CI logs).

stdout stays free for machine-readable output. A job log is public (:mod:`dplora.surface`), so under CI or without
a terminal the plain lines carry public quantities only: one every K logical steps (K = ⌈T/10⌉, from the plan),
with the step, T and the planned ε after it. No s/step, no ETA and no time-based cadence: realised step times
follow the private realised batch, and a line count that grows with the run's duration would time it. The bar
(step times, ETA, the training loss) is for the operator at the terminal only. The held-out evaluation's
progress is a bar on that terminal or nothing: its batch count is a count of a private held-out set.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from dplora.surface import in_ci, in_notebook

LINE_INTERVAL_S = 30.0


def duration(seconds: float) -> str:
    """``seconds`` (wall, ≥ 0 after rounding) in words: "42 s", "3 min 07 s", "2 h 05 min"."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class _Reporter:
    """What both reporters share: the mode (``off`` / ``bar`` on a TTY / ``lines``), the rich bar's start and
    close, and the plain lines' throttle (one at most every ``interval_s``; the first and the last always).

    Args:
        enabled: False prints nothing (``--no-progress``).
        stream: where to write (default: ``sys.stderr``); a TTY gets a rich bar, anything else plain lines.
        interval_s: seconds between plain lines.
        clock: seconds counter (tests pass a fake one).
    """

    def __init__(self, *, enabled: bool, stream: TextIO | None, interval_s: float, clock):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.interval_s = interval_s
        self._clock = clock or time.monotonic

        isatty = getattr(self.stream, "isatty", None)
        # a notebook's `!dplora` has a pseudo-terminal, but its output is saved: plain public lines there
        interactive = isatty is not None and isatty() and not in_ci() and not in_notebook()
        self.mode = "off" if not enabled else ("bar" if interactive else "lines")
        self._bar = self._task = None
        self._last_line: float | None = None

    def _start_bar(self, title: str, total: int, *, info: bool) -> None:
        """Start a rich bar titled ``title`` over ``total`` items (with an ``info`` text field if asked)."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        columns = [TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn()]
        if info:
            columns.append(TextColumn("{task.fields[info]}"))
        columns.append(TimeRemainingColumn())
        self._bar = Progress(*columns, console=Console(file=self.stream), transient=False)
        self._bar.start()
        fields = {"info": ""} if info else {}
        self._task = self._bar.add_task(title, total=total, **fields)

    def _line_due(self, last: bool) -> float | None:
        """The clock's time if a plain line is due now (the first, the ``last``, or ``interval_s`` since the
        previous one; the line is then counted as written), else None."""
        now = self._clock()
        if self._last_line is None or now - self._last_line >= self.interval_s or last:
            self._last_line = now
            return now
        return None

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the bar (if any); safe to call more than once."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


class ProgressReporter(_Reporter):
    """Reports logical steps of one run; :meth:`start`, then :meth:`update` once per step, then :meth:`close`
    (or use it as a context manager, which closes it).

    Args:
        enabled: False prints nothing (``--no-progress``).
        stream: where to write (default: ``sys.stderr``); an interactive terminal (``CI`` unset) gets a rich bar,
            anything else public plain lines every :func:`line_every` steps.
        interval_s, clock: kept for the signature; the plain lines have no time-based cadence.
        callback: called after every step with public values only, ``(step, T, planned ε after it)`` (the Python
            API's progress), whether or not anything is printed.
    """

    def __init__(
        self,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        interval_s: float = LINE_INTERVAL_S,
        clock=None,
        callback=None,
    ):
        super().__init__(enabled=enabled, stream=stream, interval_s=interval_s, clock=clock)
        self._callback = callback
        self._total = 0

    def start(self, total: int, *, done: int = 0, epsilon_at=None) -> None:
        """Begin a run of ``total`` logical steps (the plan's T); a resumed run has ``done`` of them already.

        The callback then first gets steps 1..``done`` (``epsilon_at(step)``: the plan's ε after it), so the public
        values it receives are the same sequence 1..T whichever step an interruption reached."""
        self._total = total
        if self._callback is not None and done and epsilon_at is not None:
            for step in range(1, done + 1):
                self._callback(step, total, epsilon_at(step))
        if self.mode == "bar":
            self._start_bar("DP-LoRA", total, info=True)

    def update(self, step: int, epsilon: float, seconds_per_step: float, loss: float | None = None) -> None:
        """Step ``step`` (1-based) is done; ``epsilon`` is the plan's ε after it (:meth:`TrainingPlan.epsilon_at`).

        ``seconds_per_step`` and ``loss`` are private: the bar on the operator's terminal shows them (its ETA), the
        plain lines never do. A plain line is written at step 1, at every multiple of :func:`line_every` and at T.
        """
        if self._callback is not None:  # public values only: never the loss or the step time
            self._callback(step, self._total, epsilon)
        if self.mode == "bar":
            info = f"ε≤{epsilon:.3f}" + (f"  loss {loss:.3f}" if loss is not None else "")
            self._bar.update(self._task, completed=step, info=info)
        elif self.mode == "lines" and (step == 1 or step % line_every(self._total) == 0 or step >= self._total):
            self._line(f"progress: step {step}/{self._total}, planned ε after it {epsilon:.4f}")


def line_every(total: int) -> int:
    """K, the plain lines' step cadence: ⌈T/10⌉ (≥ 1), a function of the plan's T only."""
    return max(1, -(-int(total) // 10))


class BatchReporter(_Reporter):
    """Progress of a count of work items after training (the held-out evaluation's batches), like training's:
    a rich bar on a TTY, else plain lines at most every ``interval_s`` (the first and the last always get one).

    Lines read ``<label>: batch d/total, X s/batch, ETA …``; the mean is wall time since :meth:`start` over the
    items done. They go to the operator's terminal (stderr) only, never into a released file. ``public=False`` (the
    default: the count is a private held-out set's, the times follow it) prints no plain lines at all: only an
    interactive terminal shows progress, as a bar. Call :meth:`start`,
    then :meth:`advance` after each item (or group of items), then :meth:`close` (or use it as a context manager).

    Args:
        label: what is being done, e.g. ``"held-out eval"``.
        enabled, stream: as :class:`ProgressReporter`.
        interval_s: seconds between plain lines; clock: seconds counter (tests pass a fake one).
        public: the item count and times are public (a public held-out file): plain lines off a terminal too.
    """

    def __init__(
        self,
        label: str,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        interval_s: float = LINE_INTERVAL_S,
        clock=None,
        public: bool = False,
    ):
        super().__init__(enabled=enabled, stream=stream, interval_s=interval_s, clock=clock)
        if self.mode == "lines" and not public:
            self.mode = "off"
        self.label = label
        self.total = self.done = 0
        self._t0 = None

    def start(self, total: int) -> None:
        """Begin ``total`` items (≥ 0)."""
        self.total, self.done, self._t0, self._last_line = total, 0, self._clock(), None
        if self.mode == "bar":
            self._start_bar(self.label, total, info=False)

    def advance(self, count: int = 1) -> None:
        """``count`` more items are done."""
        if self._t0 is None:
            return
        self.done = min(self.done + count, self.total)
        if self.mode == "bar":
            self._bar.update(self._task, completed=self.done)
        elif self.mode == "lines":
            now = self._line_due(self.done >= self.total)
            if now is not None:
                mean = (now - self._t0) / max(self.done, 1)
                eta = duration(mean * (self.total - self.done))
                self._line(f"{self.label}: batch {self.done}/{self.total}, {mean:.2f} s/batch, ETA {eta}")
