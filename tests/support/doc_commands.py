"""Helpers shared by tests/cli/test_doc_commands.py and its slow tier under tests/slow/."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# (file, section heading) of each block that runs, in order; "fresh" runs in a new folder seeded by the tour's
# first two lines (demo data and key), as the page says.
RUN = [
    ("README.md", "A five-minute tour", "tour"),
    ("README.md", "Your own data and model", "tour"),
    ("README.md", "Serving a release", "tour"),
    ("docs/release.md", "Checking a release with third-party tools", "tour"),
    ("docs/serving.md", "The serve path", "fresh"),
]


def blocks(text: str) -> list[tuple[str, str]]:
    """(nearest heading above, body) of each ```bash block."""
    out, heading = [], ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") and not line.startswith("#!"):
            heading = line.lstrip("#").strip()
        if line.strip() == "```bash":
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            out.append((heading, "\n".join(lines[i + 1 : j])))
            i = j
        i += 1
    return out
