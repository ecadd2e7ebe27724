"""A notebook's ``!dplora train`` prints the public lines only, though it runs on a pseudo-terminal.

ipykernel runs ``!cmd`` through IPython's pexpect-based ``system`` on Linux and macOS: the command's stderr is a
pseudo-terminal, so ``isatty()`` is true, and dplora printed the private diagnostics (held-out loss, timings) and a
progress bar with the training loss into the cell, which the ``.ipynb`` keeps. The kernel's children are now told
apart by the environment the kernel gives them (docs/notebooks.md).
"""

from __future__ import annotations

import io

import pytest
from support.notebook_output import KERNEL_ENV

from dplora.run.progress import ProgressReporter
from dplora.surface import echo_private, in_notebook


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize(
    ("env", "notebook"),
    [
        ({}, False),
        ({"TERM": "xterm-256color", "PAGER": "less"}, False),
        (KERNEL_ENV, True),
        ({**KERNEL_ENV, "TERM": "xterm-256color"}, False),  # one of the four differs: an ordinary terminal
        ({"JPY_PARENT_PID": "4242"}, True),  # jupyter_client's mark on the kernel it launched
        ({"JPY_PARENT_PID": " "}, False),
    ],
)
def test_which_processes_a_kernel_started(env, notebook):
    assert in_notebook(env) is notebook


def test_a_kernels_pseudo_terminal_gets_public_lines_only(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("DPLORA_SHOW_PRIVATE", raising=False)
    assert echo_private(stream=Tty()) and ProgressReporter(stream=Tty()).mode == "bar"  # a terminal
    for name, value in KERNEL_ENV.items():
        monkeypatch.setenv(name, value)
    assert not echo_private(stream=Tty())
    assert ProgressReporter(stream=Tty()).mode == "lines"  # the plain lines hold no loss
    assert echo_private(stream=Tty(), show_private=True)  # the operator can still ask
