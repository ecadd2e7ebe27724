"""Tiny random Llama + byte-level tokenizer built from a config: no downloads, about 1 s."""

from __future__ import annotations

from pathlib import Path


def byte_tokenizer():
    """A PreTrainedTokenizerFast over the 256 bytes plus <pad>, <eos> (ids 256, 257), built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab["<pad>"] = len(vocab)
    vocab["<eos>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tiny_llama(vocab_size: int = 258, *, hidden: int = 16, layers: int = 2, tie: bool = False, seed: int = 0):
    """A random LlamaForCausalLM: hidden 16, 2 layers, 2 heads (cases T6)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tie,
        pad_token_id=256,
        eos_token_id=257,
        bos_token_id=257,
    )
    return LlamaForCausalLM(config)


def tiny_other(kind: str, vocab_size: int = 258, *, hidden: int = 16, layers: int = 2, seed: int = 0):
    """A random causal LM of another architecture, hidden 16, 2 layers, 2 heads: ``gpt2`` (Conv1D ``c_attn``),
    ``phi3`` (fused ``qkv_proj``), ``gpt_neox`` (``query_key_value``) or ``phi`` (``q_proj``, ``v_proj``, ``dense``)."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    special = {"pad_token_id": 256, "eos_token_id": 257, "bos_token_id": 257, "vocab_size": vocab_size}
    if kind == "gpt2":
        config = tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=2, n_positions=128, **special)
        return tf.GPT2LMHeadModel(config)
    common = {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "max_position_embeddings": 128,
        **special,
    }
    if kind == "phi3":
        return tf.Phi3ForCausalLM(tf.Phi3Config(num_key_value_heads=2, **common))
    if kind == "gpt_neox":
        return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**common))
    if kind == "phi":
        return tf.PhiForCausalLM(tf.PhiConfig(num_key_value_heads=2, **common))
    raise ValueError(kind)


def save_tiny_model(folder: Path, kind: str = "llama", **kw) -> Path:
    """Write a tiny model (``kind``: llama or see :func:`tiny_other`) and its tokenizer as a Hugging Face folder."""
    folder = Path(folder)
    (tiny_llama(**kw) if kind == "llama" else tiny_other(kind, **kw)).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def tiny_causal_lm(arch: str, vocab_size: int = 258, *, hidden: int = 16, layers: int = 2, seed: int = 0):
    """A random causal LM of one architecture, built from its config (no download): hidden 16, 2 layers, 2 heads.

    ``arch``: llama, qwen2, mistral, gemma2, phi3 (fused qkv_proj, gate_up_proj) or gpt2 (Conv1D c_attn, c_proj,
    c_fc). Returns (model, LoRA target modules for that architecture).
    """
    import torch
    import transformers as tf

    common = {"vocab_size": vocab_size, "pad_token_id": 256, "eos_token_id": 257, "bos_token_id": 257}
    decoder = {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
    }
    builders = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, decoder, ["q_proj", "v_proj", "down_proj"]),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, decoder, ["q_proj", "k_proj", "o_proj", "up_proj"]),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM, decoder, ["q_proj", "v_proj", "gate_proj"]),
        "gemma2": (
            tf.Gemma2Config,
            tf.Gemma2ForCausalLM,
            {**decoder, "head_dim": hidden // 2, "sliding_window": 4, "attn_implementation": "eager"},
            ["q_proj", "v_proj", "down_proj"],
        ),
        "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, decoder, ["qkv_proj", "o_proj", "gate_up_proj"]),
        "gpt2": (
            tf.GPT2Config,
            tf.GPT2LMHeadModel,
            {
                "n_embd": hidden,
                "n_layer": layers,
                "n_head": 2,
                "n_positions": 128,
                "resid_pdrop": 0.0,
                "embd_pdrop": 0.0,
                "attn_pdrop": 0.0,
            },  # GPT-2's own dropout off: train mode must be deterministic
            ["c_attn", "c_proj", "c_fc"],
        ),
    }
    config_cls, model_cls, kw, targets = builders[arch]
    torch.manual_seed(seed)
    return model_cls(config_cls(**common, **kw)), targets


# ChatML as packaged with SmolLM2-135M-Instruct (its default system turn included), and a Llama-3-style template.
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
CHAT_SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]


def chat_tokenizer(template: str | None = CHATML):
    """:func:`byte_tokenizer` with the ChatML and Llama-3 markers as special tokens (ids 258-263, BOS
    ``<|begin_of_text|>``) and ``template``."""
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": CHAT_SPECIAL, "bos_token": "<|begin_of_text|>"})
    tok.chat_template = template
    return tok


def save_chat_model(folder: Path, template: str | None = CHATML) -> Path:
    """A tiny model (vocabulary 264) and :func:`chat_tokenizer` with ``template`` as a Hugging Face folder."""
    folder = Path(folder)
    tiny_llama(vocab_size=264).save_pretrained(folder)
    chat_tokenizer(template).save_pretrained(folder)
    return folder
