"""The slow tier of tests/tuning/test_clipguide_messages.py, whose docstring describes the module."""

from __future__ import annotations

import json

import pytest
from conftest import contract_dict, write_contract
from support.clipguide_messages import NO_PAIR
from tiny import CHATML, save_chat_model
from typer.testing import CliRunner

from dplora.cli.app import app

runner = CliRunner()


pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


def test_clip_guide_cli_on_a_messages_contract_with_a_public_file(tmp_path):
    """--public FILE of conversations: read as training reads them; the JSON report has one norm per unit."""
    model = save_chat_model(tmp_path / "model", CHATML)
    public = tmp_path / "public.jsonl"
    with open(public, "w") as fh:
        for i in range(6):
            turns = [{"role": "user", "content": f"hello {i}"}, {"role": "assistant", "content": f"hi {'x' * i}"}]
            fh.write(json.dumps({"messages": turns}) + "\n")
    raw = contract_dict(
        model, tmp_path / "private.jsonl", tmp_path / "run", data=NO_PAIR, training={"max_seq_len": 256}
    )
    cfg = write_contract(tmp_path / "c.yaml", raw)
    result = runner.invoke(app, ["clip-guide", str(cfg), "--public", str(public), "--json", "--threads", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["units"] == 6 and report["records"] == 6 and report["min"] > 0
