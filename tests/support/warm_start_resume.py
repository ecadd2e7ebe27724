"""Interrupt-and-resume helpers shared by tests/slow/engine/test_warm_start.py and test_warm_start_attacks.py."""

from __future__ import annotations

import os
import signal

from dplora.engine import warmstart


def count_warm_starts(monkeypatch) -> list[str]:
    """Patch ``warmstart.warm_start`` to append "warm" to the returned list on every call (then run the real one)."""
    calls: list[str] = []
    real_warm = warmstart.warm_start

    def counting(*args, **kw):
        calls.append("warm")
        return real_warm(*args, **kw)

    monkeypatch.setattr(warmstart, "warm_start", counting)
    return calls


def sigterm_after_step(step: int):
    """A fault hook ``(point, step)`` (for ``dplora.run.checkpoint.fault_hook``) that sends this process SIGTERM at
    ("after-step", ``step``)."""

    def hook(point, at):
        if (point, at) == ("after-step", step):
            os.kill(os.getpid(), signal.SIGTERM)

    return hook
