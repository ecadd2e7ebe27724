"""Helpers shared by tests/engine/test_model_load_errors.py and its slow tier under tests/slow/."""

from __future__ import annotations

from tiny import byte_tokenizer, tiny_causal_lm


def build_arch_dirs(tmp_path_factory):
    """Saved tiny folders of two architectures; Gemma-2's config is saved without an attention setting."""
    out = {}
    for arch in ("gemma2", "llama", "gpt2"):
        folder = tmp_path_factory.mktemp(arch)
        model, _ = tiny_causal_lm(arch)
        model.config._attn_implementation_internal = None  # as a downloaded folder: no kernel stored
        model.save_pretrained(folder)
        byte_tokenizer().save_pretrained(folder)
        out[arch] = folder
    return out
