"""Replies from base + adapters (``dplora generate``): post-processing of a release, no privacy budget.

A prompt is formatted and truncated as in training: for a prompt/response contract the tokens of
``f"{prompt}\\n"`` (the reply follows), for a text contract the prompt's tokens, without special tokens
(``dplora.data.units``). Decoding is greedy by default (deterministic); ``temperature > 0`` samples with nucleus
(top-p) filtering (Holtzman et al. 2020) through transformers' ``generate``. Sampling draws from OS entropy
unless a seed is given.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from dplora.contract.spec import Contract
from dplora.errors import BadInputError, NotPrivateError, excerpt

MAX_NEW_TOKENS = 4096  # tokens generated at most per reply (--max-new-tokens upper bound)
MAX_SEED = 2**63 - 1  # torch.manual_seed takes a signed 64-bit integer; --seed is 0 … MAX_SEED


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


def prompt_ids(contract: Contract, tokenizer, prompt: str, max_new_tokens: int) -> list[int]:
    """Token ids of ``prompt`` formatted and truncated as in training (:func:`dplora.data.units.tokenize_records`).

    For a prompt/response contract a prompt whose reply (here up to ``max_new_tokens``) would not fit in
    ``training.max_seq_len`` keeps its first max_seq_len // 2 tokens, as training did; a text prompt keeps at
    most max_seq_len tokens. When training rendered records with a chat template
    (:func:`dplora.data.chat.template_in_use`), the prompt is one user turn with the generation prompt, its last
    ``max_seq_len − min(max_new_tokens, max_seq_len // 2)`` tokens kept (the generation prompt stays).
    """
    max_len = contract.training.max_seq_len
    from dplora.data.chat import template_in_use
    from dplora.data.units import cut_cells, tokenize_cells

    template = template_in_use(tokenizer, contract.data)
    if template is not None:  # as served: one user turn and the template's generation prompt
        content = cut_cells([prompt], max_len)[0]
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], chat_template=template, tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids[-max(max_len - min(max_new_tokens, max_len // 2), 1) :]
    text = f"{prompt}\n" if contract.data.prompt_column else prompt

    ids = tokenize_cells(tokenizer, [text], max_len)[0]  # cut to max_seq_len × 32 characters first
    if contract.data.prompt_column and len(ids) + max_new_tokens > max_len:
        return ids[: max_len // 2]
    return ids[:max_len]


def generate_replies(model, tokenizer, prompts: list[str], *, contract: Contract, sampling: Sampling, device) -> list:
    """One reply per prompt (one prompt per forward: no padding, so a reply never depends on the others).

    Args:
        model: a causal LM (a peft model with adapters, or a base model), in eval mode.
        prompts: the prompts, as the user wrote them.

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
    with torch.no_grad():
        for prompt in prompts:
            ids = prompt_ids(contract, tokenizer, prompt, sampling.max_new_tokens)
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


def generate_from_run(
    target: Path,
    prompts: list[str],
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

    Args:
        prompts: P prompts (text); the result is P replies, in order.
        public_key: the signer's Ed25519 public key (PEM path); required unless ``verify`` is False.
        verify: False skips verification (``--no-verify``); then ``public_key`` must be None.

    Raises:
        BadInputError: no key and no ``--no-verify``, both, no release, unloadable model or adapters, bad settings.
        VerificationError: the release does not verify with ``public_key`` (exit 3), before any privacy verdict.
        NotPrivateError: the run is a non-private control and ``allow_non_private`` is False (exit 6).
    """
    from dplora.engine.control import NOT_DP
    from dplora.errors import VerificationError
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
    return generate_replies(model, tokenizer, prompts, contract=run.contract, sampling=sampling, device=device)
