"""The one-line refusal a CLI result must be, shared by the moved-release, classification and quiet-rule attacks
(tests/slow/release/test_moved_release_attacks.py, tests/slow/evaluate/test_classification_surface_attacks.py,
tests/slow/cli/test_quiet_rule_attacks.py)."""

from __future__ import annotations

ESC = "\x1b"


def one_error_line(result) -> str:
    """The single ``error: ...`` line on ``result``'s stderr (asserted: one line, no terminal escape)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert ESC not in result.output
    return lines[0]
