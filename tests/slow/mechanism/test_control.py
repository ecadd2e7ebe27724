"""The slow tier of tests/mechanism/test_control.py, whose docstring describes the module."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from conftest import release_statement, set_cap_args, train_tiny, trained_once
from support.control import runner

from dplora.cli.app import app
from dplora.ledger.store import Ledger

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


def _train(tmp_path, tiny_model_dir, tickets_csv, signing_key, *extra, name="ctl", **sections):
    sections.setdefault("privacy", {})["enabled"] = False
    return train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, *extra, name=name, **sections)


@pytest.fixture(scope="module")
def control_run(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    privacy = {"enabled": False}
    return trained_once(
        tmp_path_factory, "control", tiny_model_dir, tickets_csv, signing_key, name="ctl", privacy=privacy
    )


def test_control_run_signs_a_non_private_record(control_run, tickets_csv):
    """Same q and T as the DP twin, its own predicate type, no accounting, every output says NOT DP."""
    result, out = control_run
    assert "NOT DIFFERENTIALLY PRIVATE" in result.output and "non-private record" in result.output
    statement = release_statement(out)
    assert statement["predicateType"] == "https://dplora.dev/non-private/v1"
    record = statement["predicate"]
    assert record["differentially_private"] is False and "NOT DIFFERENTIALLY PRIVATE" in record["statement"]
    assert "accounting" not in record and "mechanism" not in record
    assert record["training"]["clipping"] == "none" and record["training"]["noise"] == "none"
    assert record["training"]["sample_rate"] == 8 / 120  # the DP twin's q = B/N over the same 120 rows
    assert record["training"]["steps_done"] == record["training"]["steps_planned"] == 3
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert "NOT DIFFERENTIALLY PRIVATE" in config["dplora_privacy"]
    card = (out / "adapter" / "README.md").read_text()  # the model card, signed like the adapter
    assert "# NOT DIFFERENTIALLY PRIVATE" in card and "- not-differentially-private" in card
    assert "- differential-privacy" not in card and "Privacy guarantee" not in card
    assert "adapter/README.md" in {s["name"] for s in statement["subject"]}
    lines = [json.loads(x) for x in (out.with_name(out.name + ".private") / "metrics.jsonl").read_text().splitlines()]
    assert "NOT DIFFERENTIALLY PRIVATE" in lines[0]["non_private"]
    assert [x["epsilon_upper"] for x in lines if "step" in x] == [None, None, None]
    from safetensors.torch import load_file

    weights = load_file(out / "adapter" / "adapter_model.safetensors")
    assert all(float(v.abs().max()) > 0 for k, v in weights.items() if "lora_B" in k)  # it trained


def test_verify_marks_the_control_not_private_with_exit_6(control_run, signing_key):
    _, out = control_run
    plain = runner.invoke(app, ["verify", str(out), "--public-key", str(signing_key[1])])
    assert plain.exit_code == 6
    assert plain.output.splitlines()[-1].startswith("NOT DIFFERENTIALLY PRIVATE")
    assert "OK  signature" in plain.output and "OK  artifacts" in plain.output
    allowed = runner.invoke(app, ["verify", str(out), "--public-key", str(signing_key[1]), "--allow-non-private"])
    assert allowed.exit_code == 0 and "NOT DIFFERENTIALLY PRIVATE" in allowed.output
    weights = out / "adapter" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    try:  # a tampered control still fails as a mismatch (3), before any privacy verdict
        tampered = runner.invoke(app, ["verify", str(out), "--public-key", str(signing_key[1]), "--allow-non-private"])
        assert tampered.exit_code == 3
    finally:
        data[-1] ^= 1
        weights.write_bytes(bytes(data))


def test_generate_refuses_the_control_without_the_flag(control_run, signing_key):
    _, out = control_run
    key = ["--public-key", str(signing_key[1])]
    refused = runner.invoke(app, ["generate", str(out), "--prompt", "hello", "--max-new-tokens", "3", *key])
    assert refused.exit_code == 6 and "NOT DIFFERENTIALLY PRIVATE" in refused.output
    allowed = runner.invoke(
        app, ["generate", str(out), "--prompt", "hello", "--max-new-tokens", "3", "--allow-non-private", *key]
    )
    assert allowed.exit_code == 0, allowed.output
    assert "no DP guarantee" in allowed.output


def test_ledger_refuses_the_control_on_a_population_unless_non_private(
    tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    """Without --non-private: exit 2, nothing written, no charge. With it: a charge of ε = ∞, and the population
    is then over its cap, so a later DP run on it is refused."""
    db = tmp_path / "ledger.sqlite3"
    cap = runner.invoke(app, ["ledger", *set_cap_args("tickets", db)])
    assert cap.exit_code == 0, cap.output
    privacy = {"population": "tickets"}
    refused, out = _train(tmp_path, tiny_model_dir, tickets_csv, signing_key, "--ledger", str(db), privacy=privacy)
    assert refused.exit_code == 2 and "--non-private" in refused.output and "ε=∞" in refused.output
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()
    with Ledger(db) as ledger:
        assert ledger.charges("tickets") == []
    ran, out = _train(
        tmp_path, tiny_model_dir, tickets_csv, signing_key, "--ledger", str(db), "--non-private", privacy=privacy
    )
    assert ran.exit_code == 0, ran.output
    with Ledger(db) as ledger:
        [charge] = ledger.charges("tickets")
        assert charge.epsilon == Decimal("Infinity") and charge.delta == 0 and charge.status == "settled"
        assert ledger.spent("tickets")[0] == Decimal("Infinity")
        assert ledger.releases(population="tickets") == []
        assert ledger.populations()[0]["over_cap"] is True
    later = runner.invoke(app, ["ledger", "check", "tickets", "--epsilon", "0.1", "--delta", "1e-6", "--db", str(db)])
    assert later.exit_code == 2 and "Infinity" in later.output


def test_an_interrupted_control_resumes_and_has_no_intermediate_dp_release(
    tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    """SIGTERM after step 2: the checkpoint holds the control's step count (σ = 0 history); `ledger
    record-release` refuses to sign it as a DP release; --resume finishes; the charge ends at ε = ∞."""
    import os
    import signal

    from dplora.run import checkpoint

    db = tmp_path / "ledger.sqlite3"
    cap = runner.invoke(app, ["ledger", *set_cap_args("p", db)])
    assert cap.exit_code == 0, cap.output

    def hook(point, step):
        if (point, step) == ("after-step", 2):
            os.kill(os.getpid(), signal.SIGTERM)

    extra = ("--ledger", str(db), "--non-private")
    with checkpoint.fault_hook(hook):
        stopped, out = _train(tmp_path, tiny_model_dir, tickets_csv, signing_key, *extra, privacy={"population": "p"})
    assert stopped.exit_code == 130, stopped.output
    info = checkpoint.read_info(out.with_name(out.name + ".partial"))
    assert info.step == 2 and info.meta["accountant_history"] == [[0.0, 8 / 120, 2]]
    args = ["ledger", "record-release", info.run_id, "--db", str(db), "--signing-key", str(signing_key[0])]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "non-private control" in refused.output
    resumed, out = _train(
        tmp_path, tiny_model_dir, tickets_csv, signing_key, *extra, "--resume", privacy={"population": "p"}
    )
    assert resumed.exit_code == 0, resumed.output
    assert "from its checkpoint;" in resumed.output and "step 2/3" not in resumed.output
    assert release_statement(out)["predicate"]["training"]["steps_done"] == 3
    with Ledger(db) as ledger:
        [charge] = ledger.charges("p")
        assert charge.status == "settled" and charge.epsilon == Decimal("Infinity")
