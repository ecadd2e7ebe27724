"""Records to token ids and labels, masked as in training (the loss on the response or the assistant turns only),
with the truncation counts (private) kept apart."""

from __future__ import annotations

from dplora.contract.spec import DataSection
from dplora.data.cells import tokenize_cells
from dplora.data.chat import ChatEncoder, template_in_use


def tokenize_records(table, tokenizer, data: DataSection, *, max_seq_len: int) -> list[tuple[list[int], list[int]]]:
    """Token ids and labels for every record: :func:`encode_records` without the truncation counts."""
    return encode_records(table, tokenizer, data, max_seq_len=max_seq_len)[0]


def encode_records(table, tokenizer, data: DataSection, *, max_seq_len: int):
    """Token ids and labels for every record (labels −100 off target), and the truncation counts.

    ``data`` is the contract's data section (record format, columns, chat template, ``train_on``) and
    ``max_seq_len`` its ``training.max_seq_len`` (tokens per record, ≥ 2).

    * ``text`` records train on every token (EOS appended).
    * ``prompt_response`` records train only on the response. With ``data.chat_template: auto`` and a model that has
      a chat template, the pair is rendered as a one-turn conversation (user, assistant) by
      :class:`dplora.data.chat.ChatEncoder`; otherwise (``none``, or no template) as raw ``f"{prompt}\n" + response
      + EOS``, the prompt keeping at most half of ``max_seq_len`` when the pair is too long.
    * ``messages`` records are rendered by the model's chat template (:mod:`dplora.data.chat`, plain fallback when the
      model has none), targets on the assistant turns (``data.train_on: assistant``) or every token (``all``),
      truncated by whole turns. With ``data.completion_column`` (TRL conversational prompt/completion) a record is
      the prompt's turns followed by the completion's, and only the completion's turns are targets.

    Each cell is cut to :func:`cell_char_bound` characters before tokenizing (:func:`cut_cells`).

    Returns:
        (examples, stats): one (input_ids, labels) pair per record, each of length ≤ max_seq_len tokens, in table
        order; :class:`dplora.data.chat.TruncationStats` for template-rendered records, else None (private counts).

    Raises:
        BadInputError: a chat template that fails on a record or is not prefix-stable.
    """
    max_len = max_seq_len
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []

    def enc(texts):
        return tokenize_cells(tokenizer, texts, max_len)

    out = []
    if data.text_column:
        for ids in enc(table[data.text_column]):
            ids = (ids + eos)[:max_len]
            out.append((ids, list(ids)))
        return out, None
    template = template_in_use(tokenizer, data)
    if template is not None:
        encoder = ChatEncoder(tokenizer, template, max_len, data.train_on if data.kind == "messages" else "assistant")
        encoder.check_template()  # a template property, on a synthetic conversation: the only prefix refusal
        starts = None
        if data.kind == "messages" and data.completion_column:  # TRL conversational prompt/completion
            prompts, completions = table[data.messages_key], table[data.completion_column]
            conversations = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
            starts = [len(p) for p in prompts]  # each record's own prompt length: the completion alone is a target
        elif data.kind == "messages":
            conversations = table[data.messages_key]
        else:
            conversations = [
                [{"role": "user", "content": str(p)}, {"role": "assistant", "content": str(r)}]
                for p, r in zip(table[data.prompt_column], table[data.response_column], strict=True)
            ]
        starts = starts or [0] * len(conversations)
        out = [
            encoder.encode(messages, row, first)
            for row, (messages, first) in enumerate(zip(conversations, starts, strict=True), start=1)
        ]
        return out, encoder.stats
    prompts = enc([f"{p}\n" for p in table[data.prompt_column]])  # cells are checked non-empty at load
    responses = enc(table[data.response_column])
    for p, r in zip(prompts, responses, strict=True):
        r = r + eos
        if len(p) + len(r) > max_len:
            p = p[: max_len // 2]
        ids = (p + r)[:max_len]
        labels = ([-100] * len(p) + r)[:max_len]
        out.append((ids, labels))
    return out, None
