"""Canaries in the format of the data: a fake account number inside a ticket-like reply, one protected unit each.

Every canary shares one prompt and one reply template and differs only in its secret, a random account number
(16 characters of A–Z0–9 in four groups of four, about 83 bits), as in Carlini et al. (2019), "The Secret
Sharer", arXiv 1802.08232: random candidates of the same format give the reference distribution for exposure.
Secrets and the 1/2 inclusion coins come from OS entropy (``secrets``), never a recorded seed.

For a conversations contract (``data.record_format: messages``) a canary record is one conversation, the prompt in
a user turn and the reply (with the secret) in the assistant turn, so training renders it through the chat template
with the assistant mask and the audit scores the secret's turn alone; a prompt/response contract trained through the
template (``data.chat_template: auto``) renders its pair as the same conversation (:func:`dplora.data.units.
encode_records`). Canaries are public synthetic text.
"""

from __future__ import annotations

import dataclasses
import secrets
import string

from dplora.contract.spec import DataSection

PROMPT = "Hi, could you read back the account number you have on file for me? Thanks."
REPLY = "The account number on file is {secret}."
_ALPHABET = string.ascii_uppercase + string.digits


@dataclasses.dataclass(frozen=True, kw_only=True)
class Canary:
    """One canary: its unit id, its secret and whether the coin inserted it into the training data."""

    unit_id: str
    secret: str
    inserted: bool


def random_secret(rng: secrets.SystemRandom) -> str:
    """A fake account number such as ``K7QX-09AZ-M2LT-4RQ8`` (36^16 possibilities)."""
    chars = "".join(rng.choice(_ALPHABET) for _ in range(16))
    return "-".join(chars[i : i + 4] for i in range(0, 16, 4))


def make_canaries(m: int) -> list[Canary]:
    """m canaries with distinct random secrets, each inserted independently with probability 1/2 (OS entropy).

    Raises:
        ValueError: m < 2.
    """
    if m < 2:
        raise ValueError(f"expected at least 2 canaries, got m={m}")
    rng = secrets.SystemRandom()
    found: dict[str, None] = {}
    while len(found) < m:
        found[random_secret(rng)] = None
    return [
        Canary(unit_id=f"dplora-canary-{i:05d}", secret=s, inserted=rng.random() < 0.5) for i, s in enumerate(found)
    ]


def canary_rows(data: DataSection, unit_key: str | None, unit_id: str, secret: str, copies: int = 1) -> list[dict]:
    """The records of one canary in the data's columns: ``copies`` records, all inside the unit ``unit_id``.

    ``data`` is the contract's data section and ``unit_key`` its ``privacy.unit_key`` (None: row level).

    At row level a canary is one row (``copies`` must be 1); at ticket or user level its records share the unit
    key, so the canary stays one protected unit. Columns the contract does not read are left empty (None).

    Raises:
        ValueError: copies > 1 at row level, or copies < 1.
    """
    if copies < 1 or (copies > 1 and unit_key is None):
        raise ValueError(f"copies={copies}: a row-level canary is one row (several records need a unit key)")
    reply = REPLY.format(secret=secret)
    row: dict = {}
    if data.text_column:
        row[data.text_column] = f"{PROMPT}\n{reply}"
    elif data.completion_column is not None:  # TRL conversational prompt/completion: the secret is the completion
        row[data.messages_key] = [{"role": "user", "content": PROMPT}]
        row[data.completion_column] = [{"role": "assistant", "content": reply}]
    elif data.messages_key is not None:
        row[data.messages_key] = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": reply}]
    else:
        row[data.prompt_column] = PROMPT
        row[data.response_column] = reply
    if unit_key:
        row[unit_key] = unit_id
    return [dict(row) for _ in range(copies)]
