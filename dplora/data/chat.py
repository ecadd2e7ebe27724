"""Conversations through the model's chat template: token ids, the assistant-only label mask, turn-aware truncation.

A record is one conversation, a list of ``{role, content}`` turns (roles ``system``, ``user``, ``assistant``: the
format of TRL's SFT ``messages`` datasets and of OpenAI's fine-tuning JSONL). Token ids come from
``tokenizer.apply_chat_template``; the labels are found by rendering the conversation prefix by prefix: an assistant
turn's targets are the tokens that ``messages[:i+1]`` adds after ``messages[:i]`` rendered with the generation prompt
(so the turn's header, which the server's generation prompt supplies, is not a target; its content and the template's
end-of-turn marker are). The template must have the prefix property (each rendered prefix starts the next one);
otherwise the record is refused with the template named. Source: TRL ``SFTTrainer`` assistant-only loss, HF chat
templating docs ("prefix" / ``add_generation_prompt``).

Truncation (``training.max_seq_len`` tokens): whole turns are kept from the start and later ones dropped; the first
user turn's content is cut at the token level when the context before the first reply leaves that reply fewer than
``min(its tokens + 2, max_seq_len // 2)`` tokens (as the raw prompt/response rule, where the prompt keeps at most
half), and if that is not enough the system turn is cut too (the record's own, or the template's default one, then
written as an explicit system turn with its content cut); the assistant turn that does not fit whole is cut at the token
level (``train_on: all``: whichever turn does not fit). A record left with no target token is kept with no target
(loss 0, zero gradient): dropped from the loss by a rule that looks at that record alone, never refused. Every
message's content is cut to :func:`dplora.data.cells.cell_char_bound` characters before rendering.
"""

from __future__ import annotations

import dataclasses
import hashlib

from dplora.data.cells import cut_cells, tokenize_cells
from dplora.errors import BadInputError, excerpt, names_shown

ROLES = ("system", "user", "assistant")
IGNORE = -100
# The documented fallback for a model without a chat template (conversations only; prompt/response keeps its raw
# ``f"{prompt}\n" + response`` format): one line per turn, "role: content", EOS after each assistant turn.
PLAIN_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@dataclasses.dataclass
class TruncationStats:
    """Private counts for the operator (never released): records truncated or dropped and tokens not trained on.

    Attributes:
        records: conversations tokenized.
        truncated: records that lost turns or tokens to ``max_seq_len``.
        dropped: records left with no target token (trained on with loss 0).
        turns_dropped: whole turns dropped after the cut.
        tokens_cut: tokens of the turn that was cut (rendered but not kept), not counting dropped turns.
        unstable: records on which the template stopped being prefix-stable at some turn (kept up to that turn).
    """

    records: int = 0
    truncated: int = 0
    dropped: int = 0
    turns_dropped: int = 0
    tokens_cut: int = 0
    unstable: int = 0

    def to_dict(self) -> dict:
        """The counts as a dict, labelled as not covered by DP."""
        return dataclasses.asdict(self) | {"note": "private counts, not covered by DP: operator only"}


def model_template(tokenizer) -> str | None:
    """The tokenizer's own chat template (the ``default`` one of a named set), or None."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) and template.strip() else None


def template_in_use(tokenizer, data) -> str | None:
    """The chat template training renders records with, or None for the raw formats.

    ``messages`` records: the model's template, else :data:`PLAIN_TEMPLATE`. ``prompt_response`` records: the model's
    template when ``data.chat_template`` is ``auto`` and the model has one, else None (raw ``f"{prompt}\\n" +
    response``). ``text`` records: None.
    """
    if data.kind == "messages":
        return model_template(tokenizer) or PLAIN_TEMPLATE
    if data.kind == "prompt_response" and data.chat_template == "auto":
        return model_template(tokenizer)
    return None


def template_sha256(tokenizer, data) -> str | None:
    """sha256 hex of :func:`template_in_use` (UTF-8), or None when records are not rendered by a template."""
    template = template_in_use(tokenizer, data)
    return hashlib.sha256(template.encode("utf-8")).hexdigest() if template is not None else None


def tokenization_entry(tokenizer, data) -> dict:
    """The release record's ``tokenization``: the record format, the loss mask and the chat template's sha256.

    Public: it depends on the contract and the tokenizer only, never on the data.

    Returns:
        ``{"record_format", "train_on", "chat_template", "chat_template_sha256"}``; ``chat_template`` is ``model``,
        ``plain fallback`` or ``none (raw text)``; the sha256 is None when no template renders the records.
    """
    template = template_in_use(tokenizer, data)
    if template is None:
        source = "none (raw text)"
    else:
        source = "plain fallback" if template == PLAIN_TEMPLATE else "model"
    train_on = {"text": "all", "prompt_response": "response"}.get(data.kind, data.train_on)
    if data.kind == "messages" and data.completion_column is not None:
        train_on = f"completion ({data.train_on})"
    return {
        "record_format": data.kind,
        "train_on": train_on,
        "chat_template": source,
        "chat_template_sha256": template_sha256(tokenizer, data),
    }


# ShareGPT turns (axolotl's default ``conversations`` format): ``{"from", "value"}``, roles mapped to ours. Exports
# from other tools write the roles themselves (user, assistant) in ``from``; both spellings mean the same turn.
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user", "assistant": "assistant"}
_SHAPES = (
    'expected {"role", "content"} (roles system, user, assistant) or ShareGPT {"from", "value"} (from human, gpt, '
    "user, assistant, system)"
)


def _content_text(content, where: str, turn: int):
    """A message's content as one string: a string as is; OpenAI-style content parts (``[{"type": "text", "text":
    …}]``) joined in order with no separator, as chat templates that accept parts render them. Anything else (a
    number, an image part) is returned unchanged for the caller's non-text error, or refused here naming the type."""
    if not isinstance(content, list | tuple) or not content:
        return content
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            what = names_shown([kind], 20, quote=True) if kind is not None else type(part).__name__
            raise BadInputError(
                f"{where}: message {turn} has a content part that is not text ({what}); only text is trained"
            )
        texts.append(part["text"])
    return "".join(texts)


def check_messages(value, row: int, column: str) -> list[dict]:
    """One conversation cell as a list of ``{"role", "content"}`` (other keys dropped), or a one-line error.

    A message is ``{"role", "content"}`` (TRL/OpenAI, roles :data:`ROLES`; ``content`` a string or OpenAI-style
    text parts, joined) or ShareGPT ``{"from", "value"}`` (axolotl's default; ``value`` read as ``content``; ``from``
    mapped by :data:`SHAREGPT_ROLES`: human or user → user, gpt or assistant → assistant, system → system).
    The shape is decided per message by its keys (``role`` present: TRL; else ``from``: ShareGPT).

    Args:
        value: the cell as read (a list of dicts).
        row: the record's 1-based row (a jsonl file's line when it has no blank lines).
        column: the column name, for error messages.

    Returns:
        The turns, shape [turns] of ``{"role": str, "content": str}``.

    Raises:
        BadInputError: not a non-empty list, a turn that is not an object or has neither key pair, an unknown role,
            non-text content; names the row, the column and the expected keys, never the text.

    Source: TRL dataset formats (conversational), axolotl ``sharegpt`` type (``conversations``, ``from``/``value``).
    """
    where = f"column {excerpt(column)}, data row {row}"
    if not isinstance(value, list | tuple) or not value:
        raise BadInputError(f"{where}: a conversation must be a non-empty list of messages, {_SHAPES}")
    out = []
    for turn, message in enumerate(value, start=1):
        if not isinstance(message, dict):
            raise BadInputError(f"{where}: message {turn} is not an object; {_SHAPES}")
        if message.get("role") is not None:
            role, content = message.get("role"), _content_text(message.get("content"), where, turn)
            if role not in ROLES:
                raise BadInputError(f"{where}: message {turn} has a role other than {', '.join(ROLES)}")
        elif message.get("from") is not None:
            role, content = SHAREGPT_ROLES.get(message.get("from")), _content_text(message.get("value"), where, turn)
            if role is None:
                raise BadInputError(
                    f"{where}: message {turn} (ShareGPT) has a 'from' other than {', '.join(SHAREGPT_ROLES)}"
                )
        else:
            keys = names_shown(list(message)[:4], 80, quote=True) if message else "none"
            raise BadInputError(f"{where}: message {turn} has keys {keys}; {_SHAPES}")
        if not isinstance(content, str):
            key = "content" if "role" in message and message.get("role") is not None else "value"
            raise BadInputError(f"{where}: message {turn} has non-text {key} ({type(content).__name__})")
        out.append({"role": role, "content": content})
    return out


class ChatEncoder:
    """Encode conversations with one template; see the module docstring for the mask and truncation rules.

    Args:
        tokenizer: a Hugging Face tokenizer (``apply_chat_template``; called as ``tokenizer(str,
            add_special_tokens=False)``).
        template: the Jinja chat template (:func:`template_in_use`).
        max_seq_len: tokens per record.
        train_on: ``assistant`` (targets on assistant turns only) or ``all`` (every token).
    """

    def __init__(self, tokenizer, template: str, max_seq_len: int, train_on: str = "assistant"):
        self.tokenizer, self.template, self.max_len, self.train_on = tokenizer, template, max_seq_len, train_on
        self.stats = TruncationStats()

    def _render(self, messages: list[dict], generation: bool, row: int) -> list[int]:
        try:
            text = self.tokenizer.apply_chat_template(
                messages, chat_template=self.template, tokenize=False, add_generation_prompt=generation
            )
        except Exception as err:  # a Jinja error may quote the record: name the class only
            raise BadInputError(
                f"data row {row}: the chat template cannot render it ({err.__class__.__name__})"
            ) from None
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    SYNTHETIC = (
        {"role": "user", "content": "Hello, my order has not arrived."},
        {"role": "assistant", "content": "Sorry to hear that. What is the order number?"},
        {"role": "user", "content": "It is 4417."},
        {"role": "assistant", "content": "Thanks, it ships tomorrow."},
    )

    def check_template(self) -> None:
        """Refuse a template that is not prefix-stable on a fixed synthetic conversation (a property of the
        template, public), before any record is read.

        A RECORD on which the template is not prefix-stable (e.g. SmolLM2's tokenizer merging the prompt's last
        newline with a reply that starts with spaces) is never refused: refusing would make whether a release
        exists depend on one unit's text. That record is kept up to the turn where the rendering stops
        being a prefix, like a cut (its later turns are not trained on), and counted in ``stats.unstable``
        (private).

        Raises:
            BadInputError: the template rewrites earlier turns on the synthetic conversation.
        """
        if self.train_on != "assistant":
            return
        prev: list[int] = []
        turns = list(self.SYNTHETIC)
        for i in range(len(turns)):
            full = self._render(turns[: i + 1], False, 0)
            context = self._render(turns[:i], True, 0) if turns[i]["role"] == "assistant" else full
            if full[: len(prev)] != prev or full[: len(context)] != context:
                raise BadInputError(
                    "the chat template is not prefix-stable (rendering a conversation's first turns does not start "
                    "its full rendering, e.g. a template that rewrites earlier turns), so the assistant tokens cannot "
                    "be masked; set data.train_on=all or use another template"
                )
            prev = full

    def _fit_first_reply(self, msgs: list[dict], row: int) -> tuple[list[dict], bool]:
        """Cut the context before the first reply so that it keeps ``min(its tokens + 2, max_seq_len // 2)`` tokens.

        The first user turn followed by an assistant turn (none before it) is cut first, at the token level; if the
        context is still too long, the system turn before it is cut too: the record's own, or the template's
        default one (found by :meth:`_default_system`), which is then written as an explicit system turn with its
        content cut (the same rendering, fewer tokens). Returns (turns, whether anything was cut).
        """
        max_len = self.max_len
        first = next(
            (
                i
                for i in range(len(msgs) - 1)
                if msgs[i]["role"] == "user"
                and msgs[i + 1]["role"] == "assistant"
                and all(m["role"] != "assistant" for m in msgs[:i])
            ),
            None,
        )
        if first is None:
            return msgs, False
        reply_len = len(tokenize_cells(self.tokenizer, [msgs[first + 1]["content"]], max_len)[0]) + 2
        allowed = max_len - min(reply_len, max_len // 2)
        cut = False
        candidates = [first] + [j for j in range(first) if msgs[j]["role"] == "system"][:1]
        for j in candidates:
            excess = len(self._render(msgs[: first + 1], True, row)) - allowed
            if excess <= 0:
                break
            content = tokenize_cells(self.tokenizer, [msgs[j]["content"]], max_len)[0]
            keep = max(len(content) - excess, 0)
            msgs[j] = {"role": msgs[j]["role"], "content": self.tokenizer.decode(content[:keep])}
            self.stats.tokens_cut += len(content) - keep
            cut = True
        excess = len(self._render(msgs[: first + 1], True, row)) - allowed
        default = self._default_system(msgs[: first + 1], row) if excess > 0 and msgs[0]["role"] != "system" else None
        if default is not None:  # the template's own system turn, cut like the record's own
            content = self.tokenizer(default, add_special_tokens=False)["input_ids"]
            keep = max(len(content) - excess, 0)
            msgs = [{"role": "system", "content": self.tokenizer.decode(content[:keep])}] + msgs
            self.stats.tokens_cut += len(content) - keep
            cut = True
        return msgs, cut

    def _default_system(self, msgs: list[dict], row: int) -> str | None:
        """The content of the system turn the template adds to ``msgs`` (which have none), or None.

        Found by rendering with an explicit system turn holding a marker: the text around the marker must frame
        the default rendering, and an explicit system turn with the content found must render exactly as the
        default does (else None: the template's preamble is not a system turn and is never cut).
        """

        def text(turns: list[dict]) -> str:
            return self.tokenizer.apply_chat_template(
                turns, chat_template=self.template, tokenize=False, add_generation_prompt=True
            )

        marker = "\u2063dplora-system-marker\u2063"
        try:
            plain, marked = text(msgs), text([{"role": "system", "content": marker}] + msgs)
        except Exception:  # a template that refuses an explicit system turn: nothing to cut
            return None
        before, found, after = marked.partition(marker)
        if not found or len(plain) <= len(before) + len(after):
            return None
        if not (plain.startswith(before) and plain.endswith(after)):
            return None
        default = plain[len(before) : len(plain) - len(after)]
        try:
            same = text([{"role": "system", "content": default}] + msgs) == plain
        except Exception:
            return None
        return default if same else None

    def encode(self, messages: list[dict], row: int = 0, first_target: int = 0) -> tuple[list[int], list[int]]:
        """(input_ids, labels) of one conversation, each of length ≤ ``max_seq_len``; labels −100 off target.

        Args:
            messages: the checked turns (:func:`check_messages`); contents are cut to the cell bound here.
            row: 1-based row, for error messages only.
            first_target: turns before this index are context whatever their role (TRL conversational
                prompt/completion: the prompt's length in turns, so only the completion is a target; 0: every
                assistant turn, or with ``train_on: all`` every token).

        Raises:
            BadInputError: the template fails on the record (a record where it is not prefix-stable is kept up to
                that turn and counted in ``stats.unstable``, never refused; see :meth:`check_template`).
        """
        max_len = self.max_len
        msgs = [
            {"role": m["role"], "content": c}
            for m, c in zip(messages, cut_cells([m["content"] for m in messages], max_len), strict=True)
        ]
        ids: list[int] = []
        labels: list[int] = []
        prev: list[int] = []
        cut = False
        if self.train_on == "assistant" and first_target == 0:  # a completion's context is cut by the usual rule
            msgs, cut = self._fit_first_reply(msgs, row)
        for i, message in enumerate(msgs):
            reply = message["role"] == "assistant" and i >= first_target
            if reply and self.train_on == "assistant":
                context = self._render(msgs[:i], True, row)
                full = self._render(msgs[: i + 1], False, row)
                if context[: len(prev)] != prev or full[: len(context)] != context:
                    self.stats.unstable += 1  # this record alone: kept up to here (see _unstable_here)
                    cut = True
                    break
                head, target = context[len(prev) :], full[len(context) :]
            else:
                full = self._render(msgs[: i + 1], False, row)
                if full[: len(prev)] != prev:
                    self.stats.unstable += 1
                    cut = True
                    break
                context_only = self.train_on == "assistant" or i < first_target
                head, target = (full[len(prev) :], []) if context_only else ([], full[len(prev) :])
            room = max_len - len(ids)
            if len(head) + len(target) > room:
                cut = True
                if len(head) < room and target:  # the turn's target is cut at the token level
                    kept = target[: room - len(head)]
                    ids += head + kept
                    labels += [IGNORE] * len(head) + kept
                    self.stats.tokens_cut += len(target) - len(kept)
                else:
                    self.stats.tokens_cut += len(head) + len(target)
                self.stats.turns_dropped += len(msgs) - i - 1
                break
            ids += head + target
            labels += [IGNORE] * len(head) + target
            prev = full
        self.stats.records += 1
        self.stats.truncated += cut
        if not any(y != IGNORE for y in labels):  # no target left: dropped from the loss (this record alone)
            self.stats.dropped += 1
            ids = (ids or prev or [self.tokenizer.eos_token_id or 0])[:1]
            labels = [IGNORE]
        return ids, labels


def generation_ids(tokenizer, template: str, messages: list[dict], max_len: int, max_new_tokens: int) -> list[int]:
    """Token ids of a conversation as training rendered it, for the evaluation and ``synth``: with
    ``add_generation_prompt=True``, the reply to follow.

    The same rendering as training (:class:`ChatEncoder`: the template, each content cut to
    :func:`dplora.data.cells.cell_char_bound` characters, no special tokens added beyond the template's). The last
    ``max_len − min(max_new_tokens, max_len // 2)`` tokens are kept (at least 1), so the generation prompt stays and
    the reply has room as in training. ``dplora generate`` renders as served instead (:func:`served_ids`).

    Args:
        messages: checked turns (:func:`check_messages`), shape [turns] of ``{role, content}``.
        max_len: ``training.max_seq_len``, tokens; max_new_tokens: tokens the reply may take.

    Returns:
        Token ids, length 1 … max_len.

    Raises:
        BadInputError: the template cannot render the conversation (the error class only, never the text).

    Source: HF chat templating docs (``add_generation_prompt``).
    """
    msgs = [
        {"role": m["role"], "content": c}
        for m, c in zip(messages, cut_cells([m["content"] for m in messages], max_len), strict=True)
    ]
    ids = _generation_render(tokenizer, template, msgs)
    return ids[-max(max_len - min(max_new_tokens, max_len // 2), 1) :]


def served_ids(tokenizer, template: str, messages: list[dict], char_bound: int | None = None) -> list[int]:
    """Token ids of a conversation exactly as a server renders it: ``tokenizer.apply_chat_template(messages,
    add_generation_prompt=True)`` with the run's template, whole (no cut to ``training.max_seq_len``).

    The system turn is the caller's own, or the template's default one; nothing of a training record enters.

    Args:
        messages: checked turns (:func:`check_messages`), shape [turns] of ``{role, content}``.
        char_bound: when given, each content keeps only its LAST ``char_bound`` characters before rendering, so a
            huge prompt costs bounded time; a content that long exceeds the model's context anyway (a token spans
            far fewer characters on average), and a prompt over the context keeps its last tokens, which this cut
            leaves as they were.

    Returns:
        Token ids, length ≥ 1 for any template that renders a generation prompt.

    Raises:
        BadInputError: the template cannot render the conversation (the error class only, never the text).

    Source: HF chat templating docs (``apply_chat_template``, ``add_generation_prompt``).
    """
    if char_bound is not None:
        messages = [{"role": m["role"], "content": m["content"][-char_bound:]} for m in messages]
    return _generation_render(tokenizer, template, messages)


def _generation_render(tokenizer, template: str, messages: list[dict]) -> list[int]:
    """The conversation rendered with the generation prompt and tokenized without added special tokens (what
    ``apply_chat_template(..., tokenize=True)`` does), or a one-line error naming the error class only."""
    try:
        text = tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=True
        )
    except Exception as err:  # a Jinja error may quote the conversation: name the class only
        raise BadInputError(f"the chat template cannot render the conversation ({err.__class__.__name__})") from None
    return tokenizer(text, add_special_tokens=False)["input_ids"]
