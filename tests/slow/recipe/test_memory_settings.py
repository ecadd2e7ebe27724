"""A whole ``dplora train`` with the memory settings of issue 27: gradient checkpointing, ``physical_batch_size:
auto``, ``model.attn_implementation``; the signed record names them under ``execution``; bad combinations exit 2."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import release_statement, train_tiny

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


def test_checkpointed_auto_batch_eager_run_records_its_memory_settings(
    tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    result, out = train_tiny(
        tmp_path,
        tiny_model_dir,
        tickets_csv,
        signing_key,
        model={"attn_implementation": "eager"},
        lora={"dropout": 0.1},
        training={"gradient_checkpointing": True, "physical_batch_size": "auto", "steps": 2},
    )
    assert result.exit_code == 0, result.output
    execution = release_statement(out)["predicate"]["execution"]
    assert execution["gradient_checkpointing"] == "non-reentrant"
    assert execution["attn_implementation"] == "eager"
    assert execution["physical_batch_size"] == 8 and execution["physical_batch_source"] == "auto: the CPU default"


@pytest.mark.parametrize(
    "sections, needle",
    [
        ({"training": {"gradient_checkpointing": True}, "privacy": {"per_sample": "opacus"}}, "per_sample=fast"),
        ({"training": {"gradient_checkpointing": "yes"}}, "gradient_checkpointing"),
        ({"training": {"physical_batch_size": "max"}}, "physical_batch_size"),
        ({"model": {"attn_implementation": "flash"}}, "attn_implementation"),
    ],
)
def test_bad_memory_settings_exit_2_with_one_line(tmp_path, tiny_model_dir, tickets_csv, signing_key, sections, needle):
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, **sections)
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash_attn is installed")
def test_flash_attention_without_flash_attn_exits_2(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    result, out = train_tiny(
        tmp_path, tiny_model_dir, tickets_csv, signing_key, model={"attn_implementation": "flash_attention_2"}
    )
    assert result.exit_code == 2, result.output
    assert "needs the flash_attn package" in result.output and not out.exists()
