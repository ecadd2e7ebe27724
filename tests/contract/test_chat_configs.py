"""Issue 31: the chat contracts in configs/ (demo_chat.yaml: demo conversations at user level; twcs_conversations.yaml:
TWCS conversations at customer level) plan with `dplora budget` on tiny data of their format, and demo_chat trains
on the tiny chat model through its template; configs/demo.yaml keeps its short max_seq_len explicit."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import contract_dict

from dplora.contract.loader import load_contract

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


def test_the_default_max_seq_len_keeps_whole_conversations_and_the_demo_keeps_64(tmp_path):
    from dplora.contract.loader import parse_contract

    raw = contract_dict(tmp_path / "model", tmp_path / "d.jsonl", tmp_path / "run")
    del raw["training"]["max_seq_len"]
    assert parse_contract(raw).training.max_seq_len == 320  # p95 of Bitext (263) and demo conversations (190), to 64s
    assert load_contract(ROOT / "configs" / "demo.yaml").training.max_seq_len == 64
    assert load_contract(ROOT / "configs" / "demo_chat.yaml").training.max_seq_len == 256
