"""Issue 26.1–26.2 through `dplora train`: LoRA targets that fit the model, and setup mistakes that exit 2 and leave
nothing that blocks the next run (no FAILED.json, no ledger charge left open)."""

from __future__ import annotations

import json
import os
import stat
import sys
import warnings

import pytest
from conftest import release_statement, train_tiny
from tiny import save_tiny_model

from dplora.engine import gradcheck
from dplora.ledger.store import Ledger

LLAMA_LINEAR = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


def _partial(out):
    return out.with_name(out.name + ".partial")


def _train_showing_warnings(*args, **kw):
    """train_tiny with Python warnings printed to the run's stderr, as outside pytest (which records them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        for hidden in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.filterwarnings("ignore", category=hidden)  # Python's default filters outside __main__
        warnings.showwarning = _to_stderr  # as Python's default: to sys.stderr, which CliRunner captures
        return train_tiny(*args, **kw)


def _to_stderr(message, category, filename, lineno, file=None, line=None):
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-gpt2"), kind="gpt2")


def test_all_linear_trains_and_the_record_names_the_resolved_modules(
    tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, lora={"target_modules": "all-linear"})
    assert result.exit_code == 0, result.output
    lora = release_statement(out)["predicate"]["lora"]
    assert lora["target_modules"] == LLAMA_LINEAR and lora["target_modules_requested"] == "all-linear"
    card = (out / "adapter" / "README.md").read_text()
    assert "on `down_proj`, `gate_proj`, `k_proj`, `o_proj`, `q_proj`, `up_proj`, `v_proj`)" in card
    assert "all-linear" not in card


def test_the_default_auto_trains_gpt2_on_c_attn_without_raw_library_warnings(
    tmp_path, gpt2_dir, tickets_csv, signing_key
):
    """GPT-2's attention is one Conv1D ``c_attn``: auto finds it, the fast per-example path trains it."""
    from dplora.contract.spec import LoraSection

    assert LoraSection().target_modules == "auto"
    result, out = _train_showing_warnings(tmp_path, gpt2_dir, tickets_csv, signing_key, lora={"target_modules": "auto"})
    assert result.exit_code == 0, result.output
    lora = release_statement(out)["predicate"]["lora"]
    assert lora["target_modules"] == ["c_attn"] and lora["target_modules_requested"] == "auto"
    for raw in ("fan_in_fan_out", "UserWarning:", "FutureWarning:", "warnings.warn", "is_gradient_checkpointing"):
        assert raw not in result.output, result.output


def test_an_explicit_conv1d_list_prints_no_peft_warning(tmp_path, gpt2_dir, tickets_csv, signing_key):
    result, _ = _train_showing_warnings(
        tmp_path, gpt2_dir, tickets_csv, signing_key, lora={"target_modules": ["c_attn"]}
    )
    assert result.exit_code == 0, result.output
    assert "fan_in_fan_out" not in result.output and "Warning" not in result.output, result.output


@pytest.mark.parametrize("names", [["nope_proj"], ["mlp"], ["embed_tokens"]])
def test_a_wrong_target_exits_2_on_one_line_listing_the_valid_names_and_the_rerun_needs_no_overwrite(
    names, tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, lora={"target_modules": names})
    assert result.exit_code == 2, result.output
    (line,) = _error_lines(result.output)
    assert f"lora.target_modules: {names[0]!r} not a linear module of this model" in line
    assert f"[{', '.join(LLAMA_LINEAR)}], or `all-linear`" in line
    assert "MLP(" not in result.output and "Traceback" not in result.output
    assert not out.exists() and not (_partial(out) / "FAILED.json").exists() and not _partial(out).exists()
    again, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key)  # same output_dir, no --overwrite
    assert again.exit_code == 0, again.output


@pytest.fixture
def unwritable_cache(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.access(locked, os.W_OK):  # root ignores the mode: /proc refuses everyone
        locked = "/proc"
    monkeypatch.setenv("DPLORA_CACHE_DIR", f"{locked}/nope")
    yield f"{locked}/nope"
    if locked != "/proc":
        locked.chmod(stat.S_IRWXU)


def test_an_unwritable_cache_folder_exits_2_before_converting_and_blocks_nothing(
    tmp_path, tiny_model_dir, tickets_csv, signing_key, unwritable_cache, monkeypatch
):
    from dplora.engine import model as model_mod

    def no_conversion(*_):
        raise AssertionError("the packaged model was converted before the cache folder was checked")

    with monkeypatch.context() as m:
        m.setattr(model_mod, "_from_gguf", no_conversion)
        m.setattr(model_mod, "packaged_gguf", lambda: tmp_path / "SmolLM2.gguf")
        result, out = train_tiny(
            tmp_path, tiny_model_dir, tickets_csv, signing_key, model={"name": "smollm2-135m", "path": None}
        )
        assert result.exit_code == 2, result.output
        (line,) = _error_lines(result.output)
        assert f"DPLORA_CACHE_DIR='{unwritable_cache}'" in line and "writable" in line
        assert not out.exists() and not _partial(out).exists()
    # a writable cache that already holds the converted model (the tiny one): the same command now trains
    cache = tmp_path / "cache"
    save_tiny_model(cache / "models" / "smollm2-135m-instruct")
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(cache))
    again, out = train_tiny(
        tmp_path, tiny_model_dir, tickets_csv, signing_key, model={"name": "smollm2-135m", "path": None}
    )
    assert again.exit_code == 0, again.output


def test_a_fault_during_setup_leaves_a_partial_the_next_run_replaces_and_no_open_charge(
    tmp_path, tiny_model_dir, tickets_csv, signing_key, monkeypatch
):
    """A training fault before step 0 work (exit 4) is recorded as a setup failure: no ledger charge was reserved,
    and the next run replaces the .partial without --overwrite. A failure after step 0 work began still blocks."""

    def broken(*_a, **_k):
        raise RuntimeError("injected: per-sample gradients probe")

    db = tmp_path / "ledger.sqlite3"
    Ledger(db).set_cap("tickets", epsilon_max="100", delta_max="1e-3", protected_unit="row", adjacency="add_remove")
    with monkeypatch.context() as m:
        m.setattr(gradcheck, "probe_per_sample_gradients", broken)
        result, out = train_tiny(
            tmp_path, tiny_model_dir, tickets_csv, signing_key, "--ledger", str(db), privacy={"population": "tickets"}
        )
    assert result.exit_code == 4, result.output
    failed = json.loads((_partial(out) / "FAILED.json").read_text())
    assert failed["stage"] == "setup" and failed["steps_done"] == 0
    assert Ledger(db).charges("tickets") == []  # nothing reserved, nothing left pending
    again, out = train_tiny(
        tmp_path, tiny_model_dir, tickets_csv, signing_key, "--ledger", str(db), privacy={"population": "tickets"}
    )
    assert again.exit_code == 0, again.output
    assert "holds only an earlier run's setup failure" in again.output
    (charge,) = Ledger(db).charges("tickets")
    assert charge.status == "settled"


def test_a_failed_json_without_the_setup_stage_still_blocks(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    out = tmp_path / "run"
    _partial(out).mkdir()
    (_partial(out) / "FAILED.json").write_text(json.dumps({"steps_done": 0, "reason": "failed at step 1"}))
    result, _ = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key)
    assert result.exit_code == 2 and "--overwrite" in result.output, result.output
