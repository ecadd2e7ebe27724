"""The slow tier of tests/engine/test_model_load_errors.py, whose docstring describes the module."""

from __future__ import annotations

import pytest
from conftest import release_statement, train_tiny
from support.model_load_errors import build_arch_dirs


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory):
    return build_arch_dirs(tmp_path_factory)


def test_the_release_records_the_resolved_kernel(arch_dirs, tmp_path, tickets_csv, signing_key):
    lora = {"target_modules": ["q_proj", "v_proj"]}
    result, out = train_tiny(tmp_path, arch_dirs["gemma2"], tickets_csv, signing_key, lora=lora)
    assert result.exit_code == 0, result.output
    assert release_statement(out)["predicate"]["execution"]["attn_implementation"] == "eager"
    assert "attn_implementation: auto" in (out / "contract.yaml").read_text()
