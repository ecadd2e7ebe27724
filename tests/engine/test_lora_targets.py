"""lora.target_modules resolved against the model's own module names (issue 26.1): auto, all-linear, wrong names."""

from __future__ import annotations

import warnings

import pytest
from tiny import tiny_llama, tiny_other

from dplora.engine.lora import (
    adapted_module_names,
    library_error_line,
    library_warnings,
    linear_module_names,
    resolve_target_modules,
)
from dplora.errors import BadInputError

LLAMA_LINEAR = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("llama", ["q_proj", "v_proj"]),
        ("gpt2", ["c_attn"]),
        ("phi3", ["qkv_proj"]),
        ("gpt_neox", ["query_key_value"]),
        ("phi", ["q_proj", "v_proj"]),
    ],
)
def test_auto_resolves_the_attention_projections(kind, expected):
    model = tiny_llama() if kind == "llama" else tiny_other(kind)
    assert resolve_target_modules(model, "auto") == expected


def test_linear_names_are_leaf_names_sorted_without_lm_head():
    assert linear_module_names(tiny_llama()) == LLAMA_LINEAR
    assert linear_module_names(tiny_other("gpt2")) == ["c_attn", "c_fc", "c_proj"]  # Conv1D counts as linear


def test_an_architecture_without_known_names_lists_its_linear_modules():
    import torch

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mix = torch.nn.Linear(4, 4)
            self.lm_head = torch.nn.Linear(4, 8)

    with pytest.raises(BadInputError) as info:
        resolve_target_modules(Odd(), "auto")
    assert "valid linear module names of this model: [mix]" in str(info.value)


@pytest.mark.parametrize("names", [("nope_proj",), ("mlp",), ("embed_tokens",), ("q_proj", "lm_head")])
def test_a_name_that_is_not_a_linear_module_lists_the_valid_ones(names):
    with pytest.raises(BadInputError) as info:
        resolve_target_modules(tiny_llama(), names)
    message = str(info.value)
    assert "\n" not in message and "lora.target_modules" in message
    assert f"[{', '.join(LLAMA_LINEAR)}], or `all-linear`" in message
    assert repr(names[-1]) in message and "Qwen2MLP(" not in message and "LlamaMLP(" not in message


def test_explicit_names_and_dotted_suffixes_pass_and_all_linear_is_left_to_peft():
    model = tiny_llama()
    assert resolve_target_modules(model, ("q_proj", "self_attn.k_proj")) == ["q_proj", "self_attn.k_proj"]
    assert resolve_target_modules(model, "all-linear") == "all-linear"


def test_adapted_names_are_what_peft_chose_for_all_linear():
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules="all-linear"))
    assert adapted_module_names(peft_model) == LLAMA_LINEAR


def test_adapted_names_never_claim_more_layers_than_were_trained():
    """A dotted target adapts one layer: the record lists its path, not the leaf name that means every layer."""
    from peft import LoraConfig, get_peft_model

    model = tiny_llama()
    assert model.config.num_hidden_layers >= 2
    one = get_peft_model(model, LoraConfig(r=2, target_modules=["layers.0.self_attn.q_proj"]))
    assert adapted_module_names(one) == ["model.layers.0.self_attn.q_proj"]
    both = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj", "layers.1.self_attn.v_proj"]))
    assert adapted_module_names(both) == ["model.layers.1.self_attn.v_proj", "q_proj"]


def test_library_errors_are_whole_on_one_line_and_bounded():
    err = ValueError("Target module Qwen2MLP(\n  (gate_proj): Linear()\n) is not supported.  Currently")
    assert library_error_line(err) == "Target module Qwen2MLP( (gate_proj): Linear() ) is not supported. Currently"
    assert len(library_error_line(ValueError("x " * 400))) == 300


def test_library_warnings_become_one_note_each_and_harmless_ones_are_dropped():
    lines = []
    with library_warnings(lines.append):
        for _ in range(3):
            warnings.warn("something odd\nin two lines", UserWarning, stacklevel=1)
        warnings.warn("fan_in_fan_out is set to False but the target module is `Conv1D`.", UserWarning, stacklevel=1)
        # torch's own mkldnn module, imported when peft >= 0.22 imports bitsandbytes inside the wrap
        warnings.warn(
            "`torch.jit.script_method` is deprecated. Please switch to `torch.compile` or `torch.export`.",
            DeprecationWarning,
            stacklevel=1,
        )
    assert lines == ["note: UserWarning from a library: something odd in two lines"]
