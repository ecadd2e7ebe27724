"""SIGTERM/SIGINT as a request to stop at the next logical-step boundary; a second signal stops at once.

One helper for the two places that need it: :class:`dplora.run.checkpoint.Checkpointer` (rank 0 and single-process
runs, which write a resume checkpoint first) and :class:`dplora.mechanism.reduction.FollowerSignals` (other ranks, which
pass the request on through the step's reduction). Handlers are installed only on the main thread (Python allows
nothing else) and the previous handlers are restored on exit.
"""

from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulStop:
    """Context manager: the first SIGTERM/SIGINT sets :attr:`signal_name` and calls :meth:`on_first`; a second
    one calls :meth:`on_again`, which raises ``KeyboardInterrupt`` (override either to change the message).

    Source: the POSIX convention that SIGTERM asks a job to finish cleanly (Slurm, Kubernetes and CI runners send
    SIGTERM before SIGKILL), as torchrun's elastic agent forwards it.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _on_signal(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        if self.signal_name is not None:
            self.on_again(name)
            return
        self.signal_name = name
        self.on_first(name)

    def on_first(self, name: str) -> None:
        """Called once, on the first signal (default: nothing; the loop polls :attr:`signal_name`)."""

    def on_again(self, name: str) -> None:
        """Called on every later signal. Raises: ``KeyboardInterrupt(name)``."""
        raise KeyboardInterrupt(name)


class HeldSignals(GracefulStop):
    """SIGTERM/SIGINT are recorded, never raised, while the finished run is published (every signal after the
    first too)."""

    def on_again(self, name: str) -> None:
        """A later signal: held as the first."""
