"""`clip-guide` on a conversations contract (issue 31): per-unit norms come from the tokenization and loss mask of
training (the chat template, targets on the assistant span), equal to a brute-force per-unit backward through the
engine's loss on tokens rendered by hand from the template."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import contract_dict
from support.clipguide_messages import NO_PAIR
from tiny import CHATML, save_chat_model

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


def _by_hand(tokenizer, conversation) -> tuple[list[int], list[int]]:
    """(ids, labels) from the template's own rendering: labels −100 up to the generation prompt, then the reply."""
    user = conversation[:1]
    context = tokenizer.apply_chat_template(user, chat_template=CHATML, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(conversation, chat_template=CHATML, tokenize=False)
    assert full.startswith(context)
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    n = len(tokenizer(context, add_special_tokens=False)["input_ids"])
    return ids, [-100] * n + ids[n:]


def _brute_force(contract, table) -> np.ndarray:
    """One record at a time through the engine's per-sequence loss; a unit's vector is its records' gradient sum."""
    import torch

    from dplora.data import units as data_mod
    from dplora.engine.batch import collate, per_sequence_loss
    from dplora.engine.lora import setup_model
    from dplora.engine.model import select_device

    model, tokenizer = setup_model(
        contract.model, contract.lora, contract.training, select_device(), "fp32", False, lambda *_: None
    )  # the same LoRA init
    named = [p for _, p in model.named_parameters() if p.requires_grad]
    index = data_mod.build_unit_index(table, contract.privacy, seed=contract.training.seed)
    conversations = table["messages"]
    norms = []
    for records in index.records_of_unit:
        total = torch.zeros(sum(p.numel() for p in named), dtype=torch.float64)
        for r in records:
            ids, labels = _by_hand(tokenizer, conversations[r])
            assert len(ids) <= contract.training.max_seq_len  # no truncation: the by-hand tokens are whole
            model.zero_grad(set_to_none=True)
            per_sequence_loss(model, collate([(ids, labels)], tokenizer.pad_token_id)).sum().backward()
            total += torch.cat([p.grad.reshape(-1) for p in named]).double()
        norms.append(float(total.norm()))
    return np.array(norms)


@pytest.mark.parametrize("unit", ["row", "user"])
def test_clip_guide_on_a_messages_contract_matches_brute_force(tmp_path, unit):
    from dplora.contract.loader import parse_contract
    from dplora.data import public as public_data
    from dplora.tuning import clipguide

    model = save_chat_model(tmp_path / "model", CHATML)
    privacy = {"protected_unit": unit, "max_grad_norm": 0.5}
    if unit == "user":
        privacy["unit_key"] = "customer_id"
    raw = contract_dict(
        model,
        tmp_path / "private.jsonl",
        tmp_path / "run",
        data=NO_PAIR,
        privacy=privacy,
        training={"max_seq_len": 512},
    )
    contract = parse_contract(raw)
    assert contract.data.kind == "messages"
    table, source = public_data.public_table(
        contract.data, contract.privacy, None, num_tickets=12, option="--public", units=True
    )
    assert table["messages"][0][0]["role"] == "user" and table["messages"][0][1]["role"] == "assistant"
    guide = clipguide.clip_guide(contract, table, source, sample=1000, threads=1, log=lambda *_: None)
    reference = _brute_force(contract, table)
    assert len(guide.norms) == len(reference) == (12 if unit == "row" else len(set(table["customer_id"])))
    assert reference.min() > 0
    np.testing.assert_allclose(guide.norms, reference, rtol=1e-5, atol=1e-7)
