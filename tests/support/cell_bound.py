"""Helpers shared by tests/data/test_cell_bound.py and its slow tier under tests/slow/."""

from __future__ import annotations

MB3 = 3 * 1024 * 1024


class SpyTokenizer:
    """Delegates to a real tokenizer and records the length (characters) of every text it is asked to encode."""

    def __init__(self, inner):
        self.inner, self.lengths = inner, []

    def __call__(self, texts, **kw):
        self.lengths.extend(len(t) for t in texts)
        return self.inner(texts, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)
