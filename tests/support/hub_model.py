"""Helpers shared by tests/engine/test_hub_model.py and its slow tier under tests/slow/."""

from __future__ import annotations

import shutil

from typer.testing import CliRunner

runner = CliRunner()


COMMIT = "0123456789abcdef0123456789abcdef01234567"


OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def build_hub_cache(tmp_path, tiny_model_dir, monkeypatch):
    """A Hugging Face hub cache holding ``tiny-org/tiny-llama`` at ``main`` = COMMIT and tag ``v1`` = OTHER."""
    cache = tmp_path / "hf-hub"
    repo = cache / "models--tiny-org--tiny-llama"
    for commit in (COMMIT, OTHER):
        shutil.copytree(tiny_model_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "refs" / "v1").write_text(OTHER)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))  # read at import; the env var is for subprocesses
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    return cache
