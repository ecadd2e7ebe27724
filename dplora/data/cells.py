"""The one bounded cut of every text path: a cell is cut to ``max_seq_len × 32`` characters before tokenizing."""

from __future__ import annotations

CHARS_PER_TOKEN_BOUND = 32  # characters kept per token of max_seq_len: a token is rarely more than ~10 characters


def cell_char_bound(max_seq_len: int) -> int:
    """Characters of one cell that are tokenized at most: ``max_seq_len × CHARS_PER_TOKEN_BOUND``.

    Args:
        max_seq_len: ``training.max_seq_len``, tokens per record.

    Returns:
        The bound in characters (Unicode code points), e.g. 2,048 for max_seq_len 64.
    """
    return max_seq_len * CHARS_PER_TOKEN_BOUND


def cut_cells(texts, max_seq_len: int) -> list[str]:
    """Each cell as text (``str()``) cut to its first :func:`cell_char_bound` characters (the one bounded cut).

    Args:
        texts: R cells (any values).
        max_seq_len: ``training.max_seq_len``, tokens.

    Returns:
        R strings, each of at most ``max_seq_len × 32`` characters.
    """
    bound = cell_char_bound(max_seq_len)
    return [str(t)[:bound] for t in texts]


def tokenize_cells(tokenizer, texts, max_seq_len: int) -> list[list[int]]:
    """Token ids of each cell, cut to :func:`cell_char_bound` characters BEFORE tokenizing.

    Every text path that tokenizes data cells or prompts goes through here, so memory and time do not grow with a
    cell's size (a 30 MB cell is cut to its first max_seq_len × 32 characters). Only a cell's beginning is ever
    kept (records keep their first max_seq_len tokens), and a tokenizer's tokens span far fewer than 32
    characters each on average, so the first max_seq_len tokens are the same as from the whole cell.

    Args:
        tokenizer: a Hugging Face tokenizer (called as ``tokenizer(list_of_str, add_special_tokens=False)``).
        texts: the cells (any values; ``str()`` is applied), length R.
        max_seq_len: ``training.max_seq_len``, tokens.

    Returns:
        R lists of token ids (no special tokens added), each of any length ≥ 0.

    Source: bounded-input practice (truncate before tokenizing); HF ``PreTrainedTokenizer.__call__``.
    """
    cut = cut_cells(texts, max_seq_len)
    if not cut:
        return []
    return tokenizer(cut, add_special_tokens=False)["input_ids"]
