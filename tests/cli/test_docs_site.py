"""The README and the docs site (issue 25): the README's test command is exactly `.ci/run`'s, every page in
docs/ is in mkdocs.yml's nav (and every nav entry exists), each page says who it is for, and every link from the
README into docs/ names a page that exists. `mkdocs build --strict` in .ci/run checks the links between pages."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _nav_pages(nav) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_readme_test_command_is_the_ci_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (ci,) = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("bash ")]
    assert f"```bash\n{ci}\n```" in readme
    assert "mkdocs build --strict" in ci and "--quiet" not in ci  # --quiet hides the warnings strict counts


def test_nav_lists_every_page_and_only_pages_that_exist():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(nav) == pages and len(nav) == len(set(nav))
    assert config["strict"] is True and config["theme"]["name"] == "material"
    assert {"index.md", "contract.md", "architecture.md", "sharp_edges.md"} <= set(pages) and len(pages) >= 18


def test_each_page_says_who_it_is_for():
    for page in sorted((ROOT / "docs").glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# "), page.name
        assert lines[2].startswith("*For "), page.name


def test_readme_links_into_docs_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme)
    assert len(set(links)) >= 18
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert missing == []
    assert len(readme.splitlines()) <= 250
