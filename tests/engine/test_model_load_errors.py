"""Issue 42.2: model-load errors with causes (the library's first sentence plus dplora's hint), ``auto`` attention
(sdpa where the architecture supports it, eager otherwise; recorded as resolved), a Hub id in ``model.path``."""

from __future__ import annotations

import pytest
from support.model_load_errors import build_arch_dirs

from dplora.contract.spec import ModelSection
from dplora.engine.model import load_model_and_tokenizer, resolve_attn_implementation, supports_sdpa
from dplora.errors import BadInputError


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory):
    return build_arch_dirs(tmp_path_factory)


def test_transformers_declares_sdpa_per_architecture():
    assert supports_sdpa("llama") and supports_sdpa("gpt2") and supports_sdpa("qwen2")
    assert not supports_sdpa("gemma2")
    assert supports_sdpa(None)  # unknown: transformers reports the architecture itself


@pytest.mark.parametrize(("arch", "expected"), [("gemma2", "eager"), ("llama", "sdpa"), ("gpt2", "sdpa")])
def test_auto_resolves_per_architecture_and_the_record_says_so(arch_dirs, arch, expected):
    section = ModelSection(path=str(arch_dirs[arch]))
    assert section.attn_implementation.value == "auto"  # the default
    model, _ = load_model_and_tokenizer(section)
    assert model.config._attn_implementation == expected
    assert resolve_attn_implementation(section, arch_dirs[arch], None) == expected


def test_sdpa_on_gemma2_gives_the_first_sentence_and_the_fix(arch_dirs):
    section = ModelSection(path=str(arch_dirs["gemma2"]), attn_implementation="sdpa")
    with pytest.raises(BadInputError) as info:
        load_model_and_tokenizer(section)
    assert str(info.value) == (
        f"cannot load model from {arch_dirs['gemma2']}: ValueError: Gemma2ForCausalLM does not support an attention "
        "implementation through torch.nn.functional.scaled_dot_product_attention yet; set "
        "model.attn_implementation: eager (auto picks eager where sdpa is not supported)"
    )
    assert resolve_attn_implementation(section, arch_dirs["gemma2"], None) == "sdpa"


@pytest.mark.parametrize(
    ("content", "sentence"),
    [
        (b"not a gguf file" * 8, "does not start with the GGUF magic bytes, so it is not a GGUF file"),
        (b"GGUF\x03\x00\x00\x00" + bytes(40), "has no `general.architecture` in its metadata"),
    ],
)
def test_a_broken_gguf_names_the_cause(tmp_path, content, sentence):
    path = tmp_path / "broken.gguf"
    path.write_bytes(content)
    with pytest.raises(BadInputError) as info:
        load_model_and_tokenizer(ModelSection(path=str(path)))
    message = str(info.value)
    assert message.startswith(f"cannot load model from {path}: ValueError: ")
    assert sentence in message and message.endswith("(llama, mistral, qwen2, gemma2, ...)?")
    assert "\n" not in message


def test_a_hub_id_in_model_path_points_to_model_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInputError) as info:
        load_model_and_tokenizer(ModelSection(path="Qwen/Qwen2.5-0.5B-Instruct"))
    assert "it looks like a Hub id: give it as model.name: Qwen/Qwen2.5-0.5B-Instruct" in str(info.value)
    with pytest.raises(BadInputError) as plain:
        load_model_and_tokenizer(ModelSection(path="./no-such-folder"))
    assert str(plain.value) == "model not found: model.path='no-such-folder' is neither a folder nor a .gguf file"
