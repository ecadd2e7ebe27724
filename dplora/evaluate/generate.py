"""Replies from base + adapters (``dplora generate``): post-processing of a release, no privacy budget.

``dplora generate`` feeds the model what a server feeds the merged export (``dplora export --merge``) under plain
transformers (:func:`served_prompt_ids`): a run trained through a chat template renders a prompt as one user turn,
and a conversation (``--messages``) whole, with ``tokenizer.apply_chat_template(messages,
add_generation_prompt=True)``, the template's default system turn or the caller's own, never cut to
``training.max_seq_len``; a raw-text run reads ``f"{prompt}\\n"`` (prompt/response: the format the adapters learned)
or the prompt (text), tokenized without special tokens. Only a prompt that, with ``max_new_tokens``, exceeds the
model's context (:func:`model_context`) is cut, to its last tokens, with one warning line. The template must hash as
the release record says. The evaluation and ``synth`` format a prompt as training did instead (:func:`prompt_ids`).
Decoding is greedy by default (deterministic); ``temperature > 0`` samples with nucleus (top-p) filtering (Holtzman
et al. 2020) through transformers' ``generate``. Sampling draws from OS entropy unless a seed is given.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from dplora.contract.spec import DataSection, TrainingSection
from dplora.data.cells import CHARS_PER_TOKEN_BOUND, tokenize_cells
from dplora.data.chat import check_messages, generation_ids, served_ids, template_in_use, template_sha256
from dplora.errors import BadInputError, NotPrivateError, VerificationError, excerpt

MAX_NEW_TOKENS = 4096  # tokens generated at most per reply (--max-new-tokens upper bound)
MAX_SEED = 2**63 - 1  # torch.manual_seed takes a signed 64-bit integer; --seed is 0 … MAX_SEED
# A context longer than this is a placeholder, not a limit (transformers' model_max_length default is int(1e30)).
MAX_SANE_CONTEXT = 10**7


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sampling:
    """Decoding settings: greedy when ``temperature`` is 0.

    Attributes:
        max_new_tokens: tokens generated at most per reply (EOS stops earlier), 1 … :data:`MAX_NEW_TOKENS`.
        temperature: 0 for greedy; > 0 divides the logits before sampling.
        top_p: nucleus mass kept when sampling, in (0, 1].
        seed: seeds sampling (torch.manual_seed), 0 … :data:`MAX_SEED`; None draws from OS entropy. Unused when
            greedy.
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise BadInputError(f"--max-new-tokens={self.max_new_tokens}: must be in 1 … {MAX_NEW_TOKENS}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise BadInputError(f"--temperature={self.temperature}: must be ≥ 0 (0 is greedy)")
        if not (0 < self.top_p <= 1):
            raise BadInputError(f"--top-p={self.top_p}: must be in (0, 1]")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise BadInputError(f"--seed={excerpt(str(self.seed))}: must be in 0 … 2**63 - 1")

    @property
    def greedy(self) -> bool:
        """True when decoding takes the most likely token at every step."""
        return self.temperature == 0


def prompt_ids(data: DataSection, training: TrainingSection, tokenizer, prompt, max_new_tokens: int) -> list[int]:
    """Token ids of ``prompt`` formatted and truncated as in training (:func:`dplora.data.tokens.tokenize_records`),
    for the evaluation's exact match and ``synth``; ``dplora generate`` renders as served (:func:`served_prompt_ids`).

    Args:
        prompt: text (``--prompt``/``--prompts``), or a conversation (``--messages``: a checked list of
            ``{role, content}``, :func:`dplora.data.chat.check_messages`).

    For a prompt/response contract a prompt whose reply (here up to ``max_new_tokens``) would not fit in
    ``training.max_seq_len`` keeps its first max_seq_len // 2 tokens, as training did; a text prompt keeps at
    most max_seq_len tokens. When training rendered records with a chat template
    (:func:`dplora.data.chat.template_in_use`), text is one user turn (as training rendered a prompt/response pair)
    and a conversation is rendered whole, both with the generation prompt, their last
    ``max_seq_len − min(max_new_tokens, max_seq_len // 2)`` tokens kept (:func:`dplora.data.chat.generation_ids`).

    Returns:
        Token ids, length ≤ ``training.max_seq_len``.

    Raises:
        BadInputError: a conversation for a run that did not train through a chat template, or a template that
            cannot render it.
    """
    max_len = training.max_seq_len

    template = template_in_use(tokenizer, data)
    conversation = not isinstance(prompt, str)
    if template is not None:  # as served: the turns and the template's generation prompt
        messages = prompt if conversation else [{"role": "user", "content": prompt}]
        return generation_ids(tokenizer, template, messages, max_len, max_new_tokens)
    if conversation:
        raise BadInputError(
            f"--messages: this run was trained on {data.kind} records as raw text (no chat template), "
            "so a conversation has no training format here; use --prompt"
        )
    text = f"{prompt}\n" if data.prompt_column else prompt

    ids = tokenize_cells(tokenizer, [text], max_len)[0]  # cut to max_seq_len × 32 characters first
    if data.prompt_column and len(ids) + max_new_tokens > max_len:
        return ids[: max_len // 2]
    return ids[:max_len]


def model_context(model, tokenizer) -> int | None:
    """The tokens the model attends over: the smaller of ``config.max_position_embeddings`` (GPT-2's
    ``n_positions`` through its attribute map; a multimodal config's text config) and the tokenizer's
    ``model_max_length``, of those defined and sane (an int in 1 … :data:`MAX_SANE_CONTEXT`); None if neither is."""
    config = getattr(model, "config", None)
    if config is not None and callable(getattr(config, "get_text_config", None)):
        config = config.get_text_config()
    found = (getattr(config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None))
    sane = [n for n in found if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_SANE_CONTEXT]
    return min(sane) if sane else None


def served_prompt_ids(data: DataSection, tokenizer, prompt, max_new_tokens: int, *, context: int | None, warn=None):
    """Token ids of ``prompt`` as a server feeds them to the merged export under plain transformers.

    A run trained through a chat template (:func:`dplora.data.chat.template_in_use`): text is one user turn, a
    conversation is rendered whole, both by ``apply_chat_template(messages, add_generation_prompt=True)``
    (:func:`dplora.data.chat.served_ids`): the template's default system turn or the caller's own. A raw-text run:
    the tokens of ``f"{prompt}\\n"`` for a prompt/response run, of the prompt for a text run, no special tokens
    (the format the adapters learned; docs/serving.md gives the same string to serve). Never cut to
    ``training.max_seq_len``: training's cut is no part of the served model.

    Args:
        prompt: text (``--prompt``/``--prompts``), or a checked conversation (``--messages``).
        max_new_tokens: tokens the reply may take.
        context: the model's context (:func:`model_context`); None: nothing is cut.
        warn: called with one line when the prompt is cut (it names token counts, never the prompt's text);
            default: stderr.

    Returns:
        Token ids. A prompt whose tokens plus ``max_new_tokens`` exceed ``context`` keeps its last
        ``context − max_new_tokens`` tokens (the generation prompt and the end of the last turn).

    Raises:
        BadInputError: ``max_new_tokens`` leaves no room for a prompt in ``context``; a conversation for a raw-text
            run; a template that cannot render it.
    """
    if context is not None and max_new_tokens >= context:
        raise BadInputError(
            f"--max-new-tokens={max_new_tokens}: the model's context is {context} tokens, so a reply of that length "
            "leaves no room for the prompt; give fewer"
        )
    bound = context * CHARS_PER_TOKEN_BOUND if context is not None else None  # a longer text overflows anyway
    template = template_in_use(tokenizer, data)
    if template is not None:
        messages = prompt if not isinstance(prompt, str) else [{"role": "user", "content": prompt}]
        ids = served_ids(tokenizer, template, messages, bound)
    else:
        if not isinstance(prompt, str):
            raise BadInputError(
                f"--messages: this run was trained on {data.kind} records as raw text (no chat template), "
                "so a conversation has no training format here; use --prompt"
            )
        text = f"{prompt}\n" if data.prompt_column else prompt
        ids = tokenizer([text[-bound:] if bound is not None else text], add_special_tokens=False)["input_ids"][0]
    if context is not None and len(ids) + max_new_tokens > context:
        keep = context - max_new_tokens
        (warn or _stderr)(
            f"warning: a prompt of {len(ids)} tokens plus --max-new-tokens {max_new_tokens} exceeds the model's "
            f"context of {context} tokens: its first {len(ids) - keep} tokens are dropped"
        )
        ids = ids[-keep:]
    return ids


def _stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr)


def generate_replies(
    model,
    tokenizer,
    prompts: list,
    *,
    data: DataSection,
    training: TrainingSection,
    sampling: Sampling,
    device,
    served: bool = False,
    warn=None,
) -> list:
    """One reply per prompt (one prompt per forward: no padding, so a reply never depends on the others).

    Args:
        model: a causal LM (a peft model with adapters, or a base model), in eval mode.
        prompts: P prompts, as the user wrote them: text, or conversations (lists of ``{role, content}``).
        served: True formats each prompt as served (:func:`served_prompt_ids`, ``dplora generate``); False as in
            training (:func:`prompt_ids`: the evaluation, ``synth``).
        warn: where :func:`served_prompt_ids` says a prompt was cut to the model's context (default stderr).

    Returns:
        The replies as text, special tokens removed, without the prompt.
    """
    import torch
    from transformers import GenerationConfig

    if not sampling.greedy:
        if sampling.seed is None:
            torch.seed()  # OS entropy; torch's default generator otherwise starts from a fixed seed
        else:
            torch.manual_seed(sampling.seed)
    settings = {"do_sample": False} if sampling.greedy else {"do_sample": True, "temperature": sampling.temperature}
    if not sampling.greedy:
        settings.update(top_p=sampling.top_p, top_k=0)
    config = GenerationConfig(
        max_new_tokens=sampling.max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **settings,
    )
    replies = []
    context = model_context(model, tokenizer) if served else None
    with torch.no_grad():
        for prompt in prompts:
            if served:
                ids = served_prompt_ids(data, tokenizer, prompt, sampling.max_new_tokens, context=context, warn=warn)
            else:
                ids = prompt_ids(data, training, tokenizer, prompt, sampling.max_new_tokens)
            if not ids:
                raise BadInputError("an empty prompt: every prompt needs at least one token")
            input_ids = torch.tensor([ids], device=device)
            out = model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config
            )
            replies.append(tokenizer.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True))
    return replies


def read_prompts(prompt: str | None, prompts_file: Path | None) -> list[str]:
    """The prompts: ``--prompt TEXT`` or ``--prompts FILE`` (one per non-empty line, UTF-8), exactly one.

    Raises:
        BadInputError: both or neither given, an unreadable or empty file.
    """
    if (prompt is None) == (prompts_file is None):
        raise BadInputError("give exactly one of --prompt TEXT or --prompts FILE")
    if prompt is not None:
        if not prompt.strip():
            raise BadInputError("--prompt is empty")
        return [prompt]
    try:
        lines = Path(prompts_file).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise BadInputError(f"cannot read --prompts {prompts_file}: {err.__class__.__name__}") from None
    prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise BadInputError(f"--prompts {prompts_file} has no non-empty line")
    return prompts


def read_conversations(path: Path, column: str | None) -> list[list[dict]]:
    """The conversations of ``--messages FILE``: one JSON conversation per non-empty line (UTF-8).

    A line is a list of ``{role, content}`` messages, or an object holding that list under ``column`` (the run's
    ``data.messages_column``, default ``messages``). The last message must not be an assistant turn: the reply
    follows it.

    Args:
        path: the file; column: the object key to read (None: ``messages``).

    Returns:
        C conversations, each a list of ``{role, content}`` (other keys dropped), in file order.

    Raises:
        BadInputError: an unreadable or empty file, or a bad line: names the line number, never its text.
    """
    import json

    from dplora.contract.spec import DEFAULT_MESSAGES_COLUMN

    column = column or DEFAULT_MESSAGES_COLUMN
    name = excerpt(str(path), 200)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise BadInputError(f"cannot read --messages {name}: {err.__class__.__name__}") from None
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"--messages {name} line {number}"
        try:
            value = json.loads(line)
        except ValueError:
            raise BadInputError(f"{where}: not JSON (one conversation per line)") from None
        if isinstance(value, dict):
            if column not in value:
                raise BadInputError(f"{where}: an object without the run's messages column {excerpt(column)}")
            value = value[column]
        try:
            messages = check_messages(value, number, column)
        except BadInputError as err:
            raise BadInputError(f"{where}: {str(err).split(': ', 1)[-1]}") from None
        if messages[-1]["role"] == "assistant":
            raise BadInputError(f"{where}: the last message is an assistant turn; end with the turn to reply to")
        out.append(messages)
    if not out:
        raise BadInputError(f"--messages {name} has no conversation")
    return out


def check_tokenization(run, tokenizer) -> None:
    """Refuse to generate when the model's chat template now differs from the one the release record names.

    The record's ``tokenization.chat_template_sha256`` (None: raw text, also for a record written before the entry)
    must equal :func:`dplora.data.chat.template_sha256` of the model as loaded now, or prompts would be formatted
    differently from training.

    Raises:
        BadInputError: naming both hashes (first 12 hex digits) or the raw/template change.
    """
    from dplora.release.read import released_tokenization

    recorded = (released_tokenization(run) or {}).get("chat_template_sha256")
    now = template_sha256(tokenizer, run.contract.data)
    if recorded != now:

        def say(sha):
            return "raw text (no chat template)" if sha is None else f"the chat template sha256 {sha[:12]}…"

        raise BadInputError(
            f"the release record says training rendered records as {say(recorded)}, but the model now gives "
            f"{say(now)}: the model's chat template changed since training; restore it to generate"
        )


def generate_from_run(
    target: Path,
    prompts: list,
    *,
    sampling: Sampling,
    allow_non_private: bool = False,
    public_key: Path | None = None,
    verify: bool = True,
    threads: int | None = None,
    log=print,
) -> list[str]:
    """Replies from the released adapters of the run ``target`` (a run folder or its contract).

    The release is verified first, as ``dplora synth`` does (:func:`dplora.release.verify.verify_release`: DSSE
    envelope, Ed25519 signature, every adapter file's sha256), so a tampered adapter never generates. Only with
    ``verify=False`` (``--no-verify``) is that skipped, and then one line saying ``unverified`` is logged.
    Prompts are fed as served (:func:`served_prompt_ids`); a prompt cut to the model's context is one ``log`` line.

    Args:
        prompts: P prompts (text, or conversations from :func:`read_conversations`); the result is P replies, in
            order.
        public_key: the signer's Ed25519 public key (PEM path); required unless ``verify`` is False.
        verify: False skips verification (``--no-verify``); then ``public_key`` must be None.

    Raises:
        BadInputError: no key and no ``--no-verify``, both, no release, unloadable model or adapters, bad settings,
            a chat template that differs from the record's (:func:`check_tokenization`).
        VerificationError: the release does not verify with ``public_key`` (exit 3), before any privacy verdict.
        NotPrivateError: the run is a non-private control and ``allow_non_private`` is False (exit 6).
    """
    run, model, tokenizer, device = _verified_model(
        target, allow_non_private=allow_non_private, public_key=public_key, verify=verify, threads=threads, log=log
    )
    return generate_replies(
        model,
        tokenizer,
        prompts,
        data=run.contract.data,
        training=run.contract.training,
        sampling=sampling,
        device=device,
        served=True,
        warn=log,
    )


def choose_from_run(
    target: Path,
    prompts: list[str],
    choices,
    *,
    allow_non_private: bool = False,
    public_key: Path | None = None,
    verify: bool = True,
    threads: int | None = None,
    log=print,
) -> list:
    """The chosen label of each prompt among ``choices`` (``dplora generate --choices``), from the released adapters.

    Post-processing of the release and the caller's prompts: no data file is read. The release is verified and a
    control refused exactly as :func:`generate_from_run` does. Each prompt is ranked as the evaluation ranks a
    held-out record for its headline (:func:`dplora.evaluate.classify.choose_labels`: the label as the response, as
    trained; length-normalised log-likelihood, minus the scores of the run's content-free input where the run's
    contract declares ``data.calibration: contextual``).

    Args:
        prompts: P text prompts; choices: K labels (a checked label set,
            :func:`dplora.contract.labels.parse_choices`).

    Returns:
        P :class:`dplora.evaluate.classify.Choice` (the label and its scores, nats per token), in order.

    Raises:
        BadInputError: as :func:`generate_from_run`, or a run whose records are not prompt/response pairs.
        VerificationError: the release does not verify (exit 3).
        NotPrivateError: a non-private control without ``allow_non_private`` (exit 6).
    """
    from dplora.evaluate.classify import choose_labels
    from dplora.release.read import read_run

    data = read_run(target).contract.data
    if data.kind != "prompt_response":  # the label is scored as the response of a prompt/response record
        raise BadInputError(
            f"--choices: this run was trained on {data.kind} records; ranking labels needs a prompt/response run "
            "(the label is the response)"
        )
    run, model, tokenizer, device = _verified_model(
        target, allow_non_private=allow_non_private, public_key=public_key, verify=verify, threads=threads, log=log
    )
    return choose_labels(model, tokenizer, prompts, choices, run.contract.data, run.contract.training, device=device)


def _verified_model(target: Path, *, allow_non_private: bool, public_key, verify: bool, threads, log):
    """(run, peft model, tokenizer, device) of a release verified with ``public_key`` (or ``verify`` False, said in
    one ``unverified`` line), a control refused unless ``allow_non_private``, the chat template checked.

    Raises:
        as :func:`generate_from_run`.
    """
    from dplora.mechanism.control import NOT_DP
    from dplora.release.read import load_adapter_model, read_run
    from dplora.release.verify import verify_release

    if verify and public_key is None:
        raise BadInputError(
            "generate verifies the release first: pass --public-key PATH (the signer's Ed25519 public key), "
            "or --no-verify to generate from unverified adapters"
        )
    if not verify and public_key is not None:
        raise BadInputError("give --public-key PATH or --no-verify, not both")
    run = read_run(target)
    if verify:
        try:  # the adapters loaded below must be the signed ones
            verify_release(run.folder, public_key)
        except VerificationError as err:
            raise VerificationError(f"the release in {run.folder} does not verify: {err}") from None
    else:
        log(f"unverified: the release in {run.folder} was not checked against a public key (--no-verify)")
    if not run.differentially_private:
        if not allow_non_private:
            raise NotPrivateError(
                f"{run.folder} is {NOT_DP} (a privacy.enabled=false control): "
                "pass --allow-non-private to generate from it anyway"
            )
        log(f"warning: {run.folder} is {NOT_DP}: these adapters carry no DP guarantee")
    model, tokenizer, device = load_adapter_model(run, threads=threads, log=log)
    check_tokenization(run, tokenizer)
    return run, model, tokenizer, device
