"""dplora audit --attach and the audit's ledger charge, on the tiny model: signed section, verify, refusals, tamper."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from pathlib import Path

import pytest
from conftest import contract_dict, write_contract
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.errors import VerificationError
from dplora.release import envelope as rel
from dplora.release import keys as release_keys
from dplora.release.verify import verify_release

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")
AUDIT = ["--canaries", "8", "--candidates", "20", "--no-progress", "--threads", "1"]


def _release(tmp_path, model, data, key, **privacy):
    """A signed release with a declared public N = 200 (room for the audit's canaries beside the 120 rows)."""
    raw = contract_dict(model, data, tmp_path / "rel", privacy={"num_units": 200, **privacy})
    cfg = write_contract(tmp_path / "rel.yaml", raw)
    result = runner.invoke(app, ["train", str(cfg), "--signing-key", str(key[0]), "--no-progress"])
    assert result.exit_code == 0, result.output
    return cfg, tmp_path / "rel"


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _statement(folder) -> dict:
    env = json.loads((folder / rel.RELEASE_FILENAME).read_text())
    return json.loads(base64.b64decode(env["payload"]))


def test_attach_signs_the_audit_into_the_record_and_verify_shows_it(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    cfg, run = _release(tmp_path, tiny_model_dir, tickets_csv, signing_key)
    before = _statement(run)
    adapter = {k: v for k, v in _files(run).items() if k.startswith("adapter/") or k == "contract.yaml"}
    args = ["audit", str(cfg), *AUDIT, "--data-source", "surrogate", "--attach", str(run)]
    result = runner.invoke(app, [*args, "--signing-key", str(signing_key[0])])
    assert result.exit_code == 0, result.output  # 4 guesses cannot bound ε above the claimed ε ≈ 8
    assert "attached to the release record" in result.output
    report_path = tmp_path / "rel-audit" / "audit.json"
    report = json.loads(report_path.read_text())

    after = _statement(run)
    section = after["predicate"].pop("audit")
    assert after["predicate"] == before["predicate"] and after["subject"] == before["subject"]  # only the section
    assert {k: v for k, v in _files(run).items() if k in adapter} == adapter  # artifacts untouched
    for key in ("epsilon_lower_bound", "claimed_epsilon", "delta", "canaries", "inserted", "guesses", "correct"):
        assert section[key] == report[key], key
    assert section["mia_auc"] == report["mia_auc"] and section["confidence"] == 0.95
    assert section["claimed_epsilon"] == before["predicate"]["accounting"]["epsilon_spent"]  # the release's ε
    assert section["mechanism"]["sample_rate"] == before["predicate"]["accounting"]["sample_rate"] == 8 / 200
    assert section["data"] == {"source": "surrogate", "files": [tickets_csv.name], "note": section["data"]["note"]}
    assert section["ledger"]["charged"] is True and section["ledger"]["unassigned"] is True  # every DP run is charged
    assert section["ledger"]["population"] is None and section["audit_run_id"] == report["run_id"]
    assert section["report"]["sha256"] == hashlib.sha256(report_path.read_bytes()).hexdigest()
    assert dt.date.fromisoformat(section["attached_on"]) == dt.datetime.now(dt.timezone.utc).date()  # a date, no time
    assert "per_canary" not in section  # the section carries no secrets and no per-canary scores

    pub = str(signing_key[1])
    shown = runner.invoke(app, ["verify", str(run), "--public-key", pub])
    assert shown.exit_code == 0, shown.output
    assert "OK  audit:" in shown.output
    line = next(x for x in shown.output.splitlines() if x.startswith("audit: "))
    assert f"ε lower bound {report['epsilon_lower_bound']:.3f} (95%)" in line
    # issue 49: 8 canaries is never a pass; issue 46: the line states the most this audit could show
    assert "uninformative, not a pass (8 canaries, fewer than 1000" in line and "could show at most ε̂" in line
    assert section["verdict"] == "uninformative" and section["tpr_vs_ceiling"] == report["tpr_vs_ceiling"]
    assert f"{report['correct']}/{report['guesses']} guesses correct" in line and "data: surrogate" in line
    doc = json.loads(runner.invoke(app, ["verify", str(run), "--public-key", pub, "--json"]).output)
    assert doc["ok"] is True and doc["audit"] == section

    again = runner.invoke(app, [*args, "--signing-key", str(signing_key[0]), "--out", str(tmp_path / "a2")])
    assert again.exit_code == 2 and "already has an audit section" in again.output  # one audit per release
    assert not (tmp_path / "a2").exists()


def test_tampered_or_inconsistent_audit_section_fails_verify(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    cfg, run = _release(tmp_path, tiny_model_dir, tickets_csv, signing_key)
    args = ["audit", str(cfg), *AUDIT, "--data-source", "surrogate", "--attach", str(run)]
    assert runner.invoke(app, [*args, "--signing-key", str(signing_key[0])]).exit_code == 0
    good = _files(run)
    statement = _statement(run)
    envelope = json.loads(good[rel.RELEASE_FILENAME])
    (run / rel.SIGSTORE_FILENAME).unlink()  # the signature alone must catch each change
    for key, value in statement["predicate"]["audit"].items():
        changed = json.loads(json.dumps(statement))
        changed["predicate"]["audit"][key] = "tampered" if value != "tampered" else 0
        payload = base64.b64encode(rel.canonical_json(changed)).decode()
        (run / rel.RELEASE_FILENAME).write_text(json.dumps({**envelope, "payload": payload}))
        with pytest.raises(VerificationError, match="signature"):
            verify_release(run, signing_key[1])
    # one changed byte of the payload, inside the audit section
    raw = base64.b64decode(envelope["payload"])
    at = raw.index(b'"epsilon_lower_bound":') + len(b'"epsilon_lower_bound":')
    flipped = raw[:at] + (b"9" if raw[at : at + 1] != b"9" else b"8") + raw[at + 1 :]
    (run / rel.RELEASE_FILENAME).write_text(json.dumps({**envelope, "payload": base64.b64encode(flipped).decode()}))
    assert runner.invoke(app, ["verify", str(run), "--public-key", str(signing_key[1])]).exit_code == 3
    # signed by the right key but not an audit of this record's mechanism (or ε): still refused
    for part, key, value in (("mechanism", "noise_multiplier", 0.001), (None, "claimed_epsilon", 100.0)):
        record = json.loads(json.dumps(statement["predicate"]))
        (record["audit"][part] if part else record["audit"])[key] = value
        artifacts = [run / s["name"] for s in statement["subject"]]
        private = release_keys.load_private_key(signing_key[0])
        rel.write_release(output_dir=run, record=record, artifact_files=artifacts, private_key=private)
        result = runner.invoke(app, ["verify", str(run), "--public-key", str(signing_key[1])])
        assert result.exit_code == 3 and ("noise_multiplier" in result.output or "claimed ε" in result.output)
    # an intact record whose attached audit found a violation: verify exits 5 (human and --json)
    record = json.loads(json.dumps(statement["predicate"]))
    record["audit"] |= {"violation": True, "epsilon_lower_bound": record["audit"]["claimed_epsilon"] + 1.0}
    private = release_keys.load_private_key(signing_key[0])
    rel.write_release(output_dir=run, record=record, artifact_files=artifacts, private_key=private)
    result = runner.invoke(app, ["verify", str(run), "--public-key", str(signing_key[1])])
    assert result.exit_code == 5 and "OK  signature" in result.output and "VIOLATION" in result.output
    doc = json.loads(runner.invoke(app, ["verify", str(run), "--public-key", str(signing_key[1]), "--json"]).output)
    assert (doc["ok"], doc["exit_code"], doc["audit"]["violation"]) == (False, 5, True) and "VIOLATION" in doc["error"]


def test_attach_refusals_leave_the_release_byte_identical(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    from dplora.release.keys import generate_keypair

    cfg, run = _release(tmp_path, tiny_model_dir, tickets_csv, signing_key)
    good = _files(run)
    key = ["--signing-key", str(signing_key[0])]
    base = ["audit", str(cfg), *AUDIT, "--data-source", "surrogate", "--attach", str(run)]
    other, _ = generate_keypair(tmp_path / "other.key")
    (tmp_path / "empty").mkdir()
    cases = [
        ([*base, *key, "privacy.max_grad_norm=2.0"], "max_grad_norm: audit 2.0, release 1.0"),
        ([*base, *key, "training.steps=4"], "steps: audit 4, release 3"),
        ([*base, *key, "privacy.num_units=300"], "sample_rate"),
        ([*base, *key, "privacy.enabled=false"], "never attached"),
        ([*base, "--signing-key", str(other)], "does not verify under the signing key"),
        ([*base, *key, "--out", str(run / "audit")], "outside the release folder"),
        ([*base[:-2], "--attach", str(tmp_path / "empty"), *key], "no release.dsse.json"),
        (["audit", str(cfg), *AUDIT, *key], "give --attach"),
    ]
    for args, needle in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert needle in result.output and result.output.count("error:") == 1, (needle, result.output)
        assert _files(run) == good  # untouched
        assert not (tmp_path / "rel-audit" / "run").exists()  # refused before training


def test_attach_declares_the_release_n(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """A release with a declared public N = 120: an audit contract that declares none gets N = 120, so q = 8/120 is
    the release's; the same data plus canaries holds more units, which is a local warning only (issue 23)."""
    raw = contract_dict(tiny_model_dir, tickets_csv, tmp_path / "rel", privacy={"num_units": 120})
    cfg = write_contract(tmp_path / "rel.yaml", raw)
    key = ["--signing-key", str(signing_key[0])]
    assert runner.invoke(app, ["train", str(cfg), *key, "--no-progress"]).exit_code == 0
    run = tmp_path / "rel"
    undeclared = contract_dict(tiny_model_dir, tickets_csv, tmp_path / "rel", privacy={"num_units": None})
    audit_cfg = write_contract(tmp_path / "audit.yaml", undeclared)
    full = runner.invoke(app, ["audit", str(audit_cfg), *AUDIT, "--attach", str(run), *key])
    assert full.exit_code == 0, full.output
    # the local count check is a private diagnostic: the audit run's private log, never the public output
    assert "more protected units than privacy.num_units=120" not in full.output
    private = next((tmp_path / "rel-audit").glob("**/train.log")).read_text()
    assert "more protected units than privacy.num_units=120" in private
    section = _statement(run)["predicate"]["audit"]
    assert section["mechanism"]["sample_rate"] == 8 / 120
    assert "N=120 units" in full.output  # the audit run's own plan line: the release's N, declared


def test_failed_rewrite_keeps_the_old_record(tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key):
    """A crash while re-signing (second rename) restores the old envelope and bundle byte for byte."""
    cfg, run = _release(tmp_path, tiny_model_dir, tickets_csv, signing_key)
    good = _files(run)
    real, calls = rel.os.replace, []

    def flaky(src, dst):  # the second rename into the release folder fails (training renames elsewhere)
        if Path(dst).parent == run.resolve():
            calls.append(dst)
            if len(calls) == 2:
                raise OSError(28, "disk full")
        real(src, dst)

    monkeypatch.setattr(rel.os, "replace", flaky)
    args = ["audit", str(cfg), *AUDIT, "--data-source", "surrogate", "--attach", str(run)]
    result = runner.invoke(app, [*args, "--signing-key", str(signing_key[0])])
    assert result.exit_code == 2 and "disk full); the old record is kept" in result.output, result.output
    assert len(calls) >= 2 and _files(run) == good
    verify_release(run, signing_key[1])


def test_audit_with_ledger_is_charged_like_train(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """A private-data audit is charged like a release: one charge with its ε, δ and run id; over the cap: refused."""
    from dplora.ledger.store import Ledger

    db = tmp_path / "ledger.sqlite3"
    Ledger(db).set_cap(
        "tickets", epsilon_max="17", delta_max="1e-3", protected_unit="row", adjacency="add_remove"
    )  # a release and one audit at ε ≤ 8 fit
    raw = contract_dict(tiny_model_dir, tickets_csv, tmp_path / "rel", privacy={"num_units": 200})
    raw["privacy"]["population"] = "tickets"
    cfg = write_contract(tmp_path / "rel.yaml", raw)
    ledger = ["--ledger", str(db)]
    trained = runner.invoke(app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress", *ledger])
    assert trained.exit_code == 0, trained.output
    (release_charge,) = Ledger(db).charges("tickets")

    args = ["audit", str(cfg), *AUDIT, "--attach", str(tmp_path / "rel"), "--signing-key", str(signing_key[0])]
    result = runner.invoke(app, [*args, *ledger])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "rel-audit" / "audit.json").read_text())
    charges = {c.run_id: c for c in Ledger(db).charges("tickets")}
    assert len(charges) == 2 and release_charge.run_id in charges
    audit_charge = charges[report["run_id"]]
    assert audit_charge.status == "settled" and audit_charge.purpose == "release"
    assert float(audit_charge.epsilon) == pytest.approx(report["claimed_epsilon"]) and 7.0 < report["claimed_epsilon"]
    assert float(audit_charge.delta) == pytest.approx(report["delta"]) == 1e-5
    section = _statement(tmp_path / "rel")["predicate"]["audit"]
    assert section["data"]["source"] == "private"
    assert section["ledger"] == {
        "charged": True,
        "population": "tickets",
        "unassigned": False,
        "run_id": report["run_id"],
        "epsilon": report["claimed_epsilon"],
        "delta": 1e-5,
    }
    # issue 40 item 5: an audit on the private units is a second DP run published in the record: the claim that
    # verify, verify --json and the card state is the two runs composed (never the release's ε alone)
    composed = section["composed"]
    release_eps = _statement(tmp_path / "rel")["predicate"]["accounting"]["epsilon_spent"]
    basic = composed["compositions"]["basic"]["epsilon"]
    assert basic == pytest.approx(release_eps + report["claimed_epsilon"], rel=1e-12)
    assert release_eps < composed["total_epsilon"] <= basic and composed["total_delta"] == pytest.approx(2e-5)
    shown = runner.invoke(app, ["verify", str(tmp_path / "rel"), "--public-key", str(signing_key[1])])
    assert shown.exit_code == 0 and f"total ε={composed['total_epsilon']:.4f}" in shown.stdout
    doc = json.loads(
        runner.invoke(app, ["verify", str(tmp_path / "rel"), "--public-key", str(signing_key[1]), "--json"]).stdout
    )
    assert doc["claims"]["composed_with_audit"]["total_epsilon"] == composed["total_epsilon"]
    card = (tmp_path / "rel" / "adapter" / "README.md").read_text()
    assert f"ε = {composed['total_epsilon']:.4f}" in card

    listed = Ledger(db).releases(release_charge.run_id)  # the re-signed record is listed beside the first one
    assert [r["label"] for r in listed] == ["final", "audit attached"]
    envelope = tmp_path / "rel" / rel.RELEASE_FILENAME
    assert listed[1]["record_sha256"] == hashlib.sha256(envelope.read_bytes()).hexdigest()
    assert float(Ledger(db).charge(release_charge.run_id).epsilon) == pytest.approx(float(release_charge.epsilon))

    # the ledger composes the stored events: lower the cap to just above the two charges' composed total, which
    # a third charge at ε ≤ 8 cannot fit (by basic composition 17 would still hold 2 of the 3, not all 3)
    composed = Ledger(db).total("tickets")["epsilon"]
    Ledger(db).set_cap(
        "tickets",
        epsilon_max=f"{float(composed) + 0.01:.4f}",
        delta_max="1e-3",
        protected_unit="row",
        adjacency="add_remove",
    )
    second = runner.invoke(app, ["audit", str(cfg), *AUDIT, "--out", str(tmp_path / "a2"), *ledger])
    assert second.exit_code == 2 and "exceeds the cap" in second.output  # as train: refused before training
    assert len(Ledger(db).charges("tickets")) == 2
    assert not (tmp_path / "a2" / "run").exists() and not (tmp_path / "a2" / "audit.json").exists()


def test_attach_with_a_relative_run_path(tmp_path, tiny_model_dir, tickets_csv, signing_key, monkeypatch):
    """Issue 41.5: ``--attach rel`` from the folder that holds it. On main the audit ran, then re-signing failed
    with "artifact rel/adapter/README.md is missing or not a file" (the subjects were joined to the relative
    folder, then resolved against the folder again) and exit 2; now it attaches and verifies."""
    cfg, run = _release(tmp_path, tiny_model_dir, tickets_csv, signing_key)
    before = _statement(run)
    monkeypatch.chdir(tmp_path)
    args = ["audit", cfg.name, *AUDIT, "--data-source", "surrogate", "--attach", "rel"]
    result = runner.invoke(app, [*args, "--signing-key", str(signing_key[0])])
    assert result.exit_code == 0, result.output
    assert "is missing" not in result.output and "attached to the release record" in result.output
    after = _statement(run)
    assert "audit" in after["predicate"] and after["subject"] == before["subject"]
    shown = runner.invoke(app, ["verify", "rel", "--public-key", str(signing_key[1])])
    assert shown.exit_code == 0 and "OK  audit:" in shown.output, shown.output
