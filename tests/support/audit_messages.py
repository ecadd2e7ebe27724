"""Helpers shared by tests/audit/test_audit_messages.py and its slow tier under tests/slow/."""

from __future__ import annotations

import json

from conftest import contract_dict
from tiny import CHATML, save_chat_model

NO_PAIR = {"prompt_column": None, "response_column": None}


PRIVATE_MARK = "PRIVATE-TICKET-TEXT"


def chats(path, n: int = 24):
    with open(path, "w") as fh:
        for i in range(n):
            turns = [
                {"role": "user", "content": f"{PRIVATE_MARK} order {i} is late"},
                {"role": "assistant", "content": f"sorry, order {i} ships today"},
            ]
            fh.write(json.dumps({"customer": f"c{i % 8}", "messages": turns}) + "\n")
    return path


def shared_contract(tmp_path):
    from dplora.contract.loader import parse_contract

    model = save_chat_model(tmp_path / "model", CHATML)
    raw = contract_dict(
        model,
        chats(tmp_path / "chats.jsonl"),
        tmp_path / "o",
        data=NO_PAIR,
        privacy={"protected_unit": "user", "unit_key": "customer", "num_units": 14},
        training={"max_seq_len": 256, "steps": 2},
    )
    return raw, parse_contract(raw)
