"""Helpers shared by tests/cli/test_notebook_output.py and its slow tier under tests/slow/."""

from __future__ import annotations

# what ipykernel's ZMQInteractiveShell.init_environment sets for every process the kernel starts
KERNEL_ENV = {"TERM": "xterm-color", "CLICOLOR": "1", "PAGER": "cat", "GIT_PAGER": "cat"}
