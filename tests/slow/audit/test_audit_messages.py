"""The slow tier of tests/audit/test_audit_messages.py, whose docstring describes the module."""

from __future__ import annotations

import json
import math

import pytest
from conftest import write_contract
from support.audit_messages import PRIVATE_MARK, shared_contract
from tiny import CHATML
from typer.testing import CliRunner

from dplora.audit import canaries
from dplora.cli.app import app

runner = CliRunner()


pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


def test_audit_of_a_messages_contract_scores_canaries_through_the_template(tmp_path):
    """A full `dplora audit` on a conversations contract: each canary's adapter loss equals the mean NLL of its
    assistant span computed by hand from the template's rendering; nothing private in the report."""
    import torch

    from dplora.release.read import load_adapter_model, read_run

    raw, _ = shared_contract(tmp_path)
    cfg = write_contract(tmp_path / "a.yaml", raw)
    args = ["audit", str(cfg), "--canaries", "8", "--candidates", "10", "--no-progress", "--threads", "1"]
    result = runner.invoke(app, [*args, "--data-source", "surrogate"])
    assert result.exit_code in (0, 5), result.output
    folder = tmp_path / "o-audit"
    text = (folder / "audit.json").read_text()
    assert PRIVATE_MARK not in text and PRIVATE_MARK not in (folder / "audit.md").read_text()
    assert PRIVATE_MARK not in result.output
    report = json.loads(text)
    model, tokenizer, _ = load_adapter_model(read_run(folder / "run"), threads=1, log=lambda *_: None)
    for c in report["per_canary"][:3]:
        reply = canaries.REPLY.format(secret=c["secret"])
        prompt = [{"role": "user", "content": canaries.PROMPT}]
        context = tokenizer.apply_chat_template(
            prompt, chat_template=CHATML, tokenize=False, add_generation_prompt=True
        )
        full = tokenizer.apply_chat_template(
            [*prompt, {"role": "assistant", "content": reply}], chat_template=CHATML, tokenize=False
        )
        n_context = len(tokenizer(context, add_special_tokens=False)["input_ids"])
        ids = torch.tensor([tokenizer(full, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
        nll = -logp[torch.arange(ids.shape[1] - 1), ids[0, 1:]]
        by_hand = float(nll[n_context - 1 :].mean())  # targets: the tokens after the generation prompt
        assert c["adapter_loss"] == pytest.approx(by_hand, rel=1e-4)
        assert math.isfinite(c["base_loss"]) and c["score"] == pytest.approx(c["base_loss"] - c["adapter_loss"])
