"""dplora synth (issue 18): rows in the training schema from a release, a signed manifest that `verify` checks
(one tampered byte caught, a wrong release caught), the non-private refusal and its NO DP GUARANTEE marks, and
verbatim-match counts that never hold training text."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
from pathlib import Path

import pytest
from conftest import contract_dict, train_ok, write_contract
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.contract.loader import load_contract
from dplora.release.derived import NO_DP_GUARANTEE
from dplora.synth.files import MARKER_COLUMN, build_rows, memorisation_counts

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    tmp = tmp_path_factory.mktemp("synth")
    dp = train_ok(tmp, tiny_model_dir, tickets_csv, signing_key, name="dp")
    control = train_ok(tmp, tiny_model_dir, tickets_csv, signing_key, name="ctl", privacy=dict(enabled=False))
    prompts = tmp / "public.csv"
    prompts.write_text("message\nMy order has not arrived\nHow do I reset my password?\nCancel my plan\n")
    return dp, control, prompts


def _synth(run: Path, out: Path, prompts: Path, key: Path, *extra: str):
    args = ["synth", str(run), "--rows", "5", "--out", str(out), "--prompts", str(prompts), "--signing-key", str(key)]
    return runner.invoke(app, [*args, "--max-new-tokens", "8", "--seed", "3", "--threads", "1", *extra])


def _verify(run: Path, out: Path, pub: Path, *extra: str):
    return runner.invoke(app, ["verify", str(run), "--public-key", str(pub), "--synthetic", str(out), *extra])


def _payload(envelope: Path) -> tuple[bytes, dict]:
    payload = base64.b64decode(json.loads(envelope.read_text())["payload"])
    return payload, json.loads(payload)


def test_synth_writes_the_training_schema_and_a_manifest_that_verify_accepts(runs, signing_key, tmp_path):
    dp, _, prompts = runs
    out = tmp_path / "synthetic.csv"
    result = _synth(dp, out, prompts, signing_key[0])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert len(rows) == 5 and list(rows[0]) == ["message", "reply"]  # the demo tickets' columns, nothing more
    assert [r["message"] for r in rows] == [
        "My order has not arrived",
        "How do I reset my password?",
        "Cancel my plan",
        "My order has not arrived",
        "How do I reset my password?",
    ]  # public prompt i mod 3
    _, manifest = _payload(Path(str(out) + ".dsse.json"))
    release_payload, release = _payload(dp / "release.dsse.json")
    assert manifest["predicateType"] == "https://dplora.dev/synthetic/v1"
    assert manifest["subject"] == [
        {"name": "synthetic.csv", "digest": {"sha256": hashlib.sha256(out.read_bytes()).hexdigest()}}
    ]
    pred = manifest["predicate"]
    assert pred["source_release"]["record_digest"]["sha256"] == hashlib.sha256(release_payload).hexdigest()
    assert pred["rows"] == 5 and pred["generation"]["seed"] == 3 and pred["generation"]["temperature"] == 1.0
    eps = release["predicate"]["accounting"]["epsilon_spent"]
    assert f"ε={eps:.4g}" in pred["guarantee"] and "the same guarantee and no more" in pred["guarantee"]
    assert NO_DP_GUARANTEE not in json.dumps(pred)
    check = _verify(dp, out, signing_key[1])
    assert check.exit_code == 0, check.output
    assert "OK  chain" in check.output and f"ε={eps:.4g}" in check.output
    # the same seed gives the same file, byte for byte
    again = tmp_path / "again.csv"
    assert _synth(dp, again, prompts, signing_key[0]).exit_code == 0
    assert again.read_bytes() == out.read_bytes()


def test_verify_catches_one_tampered_byte_and_a_wrong_release(runs, signing_key, tmp_path):
    dp, control, prompts = runs
    out = tmp_path / "synthetic.jsonl"
    assert _synth(dp, out, prompts, signing_key[0]).exit_code == 0
    assert [json.loads(line).keys() for line in out.read_text().splitlines()][0] == {"message", "reply"}
    original = out.read_bytes()
    tampered = bytearray(original)
    tampered[len(tampered) // 2] ^= 0x01  # one bit of one byte
    out.write_bytes(bytes(tampered))
    result = _verify(dp, out, signing_key[1])
    assert result.exit_code == 3 and "sha256 mismatch" in result.output
    out.write_bytes(original)
    assert _verify(dp, out, signing_key[1]).exit_code == 0
    wrong = _verify(control, out, signing_key[1], "--allow-non-private")  # an intact release, but not the source
    assert wrong.exit_code == 3 and "release record" in wrong.output


def test_synth_refuses_a_control_and_marks_it_no_dp_guarantee_when_allowed(runs, signing_key, tmp_path):
    _, control, prompts = runs
    out = tmp_path / "ctl.csv"
    refused = _synth(control, out, prompts, signing_key[0])
    assert refused.exit_code == 6 and "--allow-non-private" in refused.output
    assert list(tmp_path.iterdir()) == []  # nothing written
    allowed = _synth(control, out, prompts, signing_key[0], "--allow-non-private")
    assert allowed.exit_code == 0, allowed.output
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert len(rows) == 5 and all(r[MARKER_COLUMN] == NO_DP_GUARANTEE for r in rows)
    _, manifest = _payload(Path(str(out) + ".dsse.json"))
    assert manifest["predicateType"] == "https://dplora.dev/synthetic-non-private/v1"
    assert manifest["predicate"]["guarantee"].startswith(NO_DP_GUARANTEE)
    assert (
        manifest["predicate"]["warning"] == NO_DP_GUARANTEE and manifest["predicate"]["differentially_private"] is False
    )
    no_flag = _verify(control, out, signing_key[1])
    assert no_flag.exit_code == 6 and NO_DP_GUARANTEE in no_flag.output
    assert _verify(control, out, signing_key[1], "--allow-non-private").exit_code == 0


def test_synth_needs_public_prompts_and_a_csv_or_jsonl(runs, signing_key, tmp_path):
    dp, _, prompts = runs
    no_prompts = runner.invoke(
        app, ["synth", str(dp), "--rows", "2", "--out", str(tmp_path / "s.csv"), "--signing-key", str(signing_key[0])]
    )
    assert no_prompts.exit_code == 2 and "--prompts" in no_prompts.output
    bad_fmt = _synth(dp, tmp_path / "s.txt", prompts, signing_key[0])
    assert bad_fmt.exit_code == 2 and ".csv or .jsonl" in bad_fmt.output
    inside = _synth(dp, dp / "s.csv", prompts, signing_key[0])
    assert inside.exit_code == 2 and "outside the run folder" in inside.output and not (dp / "s.csv").exists()
    assert list(tmp_path.iterdir()) == []


def test_verbatim_matches_are_counted_never_quoted(runs, tickets_csv):
    dp, _, _ = runs
    contract = load_contract(dp / "contract.yaml")
    train = list(csv.DictReader(tickets_csv.open(encoding="utf-8")))
    prompts = [train[0]["message"], train[1]["message"], "a public prompt"]
    generated = [train[0]["reply"], "an invented reply", train[5]["reply"]]
    rows = build_rows(contract.data, prompts, generated, private=True)
    warnings: list[str] = []
    counts = memorisation_counts(rows, contract.data, log=warnings.append, unit_key=contract.privacy.unit_key)
    assert counts["exact_row_matches"] == 1  # row 0 equals training row 0 as a whole
    expected_fields = sum(g in {t["reply"] for t in train} for g in generated)
    assert counts["exact_generated_field_matches"] == expected_fields >= 2
    assert counts["training_rows"] == len(train)
    assert counts["flagged_rows"] == [0]  # the report flags which synthetic rows to drop, by number
    assert counts["flagged_generated_rows"] == [i for i, g in enumerate(generated) if g in {t["reply"] for t in train}]
    text = json.dumps(counts) + " ".join(warnings)
    assert warnings and not any(t["reply"] in text or t["message"] in text for t in train)


def test_a_text_contract_gets_a_text_column_that_starts_with_the_public_prompt(
    tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    raw = contract_dict(tiny_model_dir, tickets_csv, tmp_path / "text", training={"steps": 2})
    raw["data"] = {"path": str(tickets_csv), "text_column": "message"}
    cfg = write_contract(tmp_path / "text.yaml", raw)
    trained = runner.invoke(app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"])
    assert trained.exit_code == 0, trained.output
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello, I need help\nMy invoice\n")
    out = tmp_path / "text.jsonl"
    assert _synth(tmp_path / "text", out, prompts, signing_key[0]).exit_code == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 5 and all(list(r) == ["message"] for r in rows)
    assert [
        r["message"].startswith(p)
        for r, p in zip(rows, ["Hello, I need help", "My invoice"] * 2 + ["Hello, I need help"], strict=True)
    ] == [True] * 5
    assert _verify(tmp_path / "text", out, signing_key[1]).exit_code == 0


def test_csv_rows_round_trip_with_carriage_returns_and_quotes():
    from dplora.synth.files import serialize_rows

    rows = [{"message": 'a "quoted"\rline', "reply": "two\nlines\r\n, and a comma"}, {"message": "b", "reply": "\r"}]
    text = serialize_rows(rows, ".csv").decode("utf-8")
    assert list(csv.DictReader(io.StringIO(text, newline=""))) == rows
    jsonl = serialize_rows(rows, ".jsonl").decode("utf-8").splitlines()
    assert [json.loads(line) for line in jsonl] == rows


def test_verify_json_holds_the_synthetic_checks_and_one_document_on_a_mismatch(runs, signing_key, tmp_path):
    dp, control, prompts = runs
    out = tmp_path / "s.csv"
    assert _synth(dp, out, prompts, signing_key[0]).exit_code == 0
    ok = _verify(dp, out, signing_key[1], "--json")
    doc = json.loads(ok.stdout)
    assert ok.exit_code == 0 and doc["ok"] is True
    assert [c["check"] for c in doc["checks"]][-3:] == ["manifest", "synthetic file", "chain"]
    assert doc["synthetic"]["rows"] == 5 and doc["synthetic"]["differentially_private"] is True
    assert doc["synthetic"]["predicate_type"] == "https://dplora.dev/synthetic/v1"
    out.write_bytes(out.read_bytes().replace(b"\n", b"\r\n", 1))  # one byte added
    bad = _verify(dp, out, signing_key[1], "--json")
    doc = json.loads(bad.stdout)
    assert bad.exit_code == 3 and doc == {"ok": False, "exit_code": 3, "error": doc["error"]}
    assert "sha256 mismatch" in doc["error"]


def test_a_manifest_signed_by_another_key_or_renamed_file_is_caught(runs, signing_key, tmp_path):
    from dplora.release.keys import generate_keypair

    dp, _, prompts = runs
    other_priv, other_pub = generate_keypair(tmp_path / "keys" / "other.key")
    out = tmp_path / "s.jsonl"
    # the release does not verify with another key: synth refuses before generating (exit 3), nothing written
    refused = _synth(dp, out, prompts, other_priv)
    assert refused.exit_code == 3 and "does not verify with the signing key" in refused.output
    assert not out.exists()
    assert _synth(dp, out, prompts, signing_key[0]).exit_code == 0
    wrong_key = _verify(dp, out, other_pub)  # the release itself fails first under another key
    assert wrong_key.exit_code == 3
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_bytes(out.read_bytes())
    moved = _verify(dp, renamed, signing_key[1], "--manifest", str(out) + ".dsse.json")
    assert moved.exit_code == 3 and "manifest covers 's.jsonl'" in moved.output
    missing = _verify(dp, renamed, signing_key[1])
    assert missing.exit_code == 2 and "no manifest" in missing.output


def test_synth_refuses_a_run_whose_adapter_changed_after_release(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    run = train_ok(tmp_path, tiny_model_dir, tickets_csv, signing_key, name="changed")
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    weights = run / "adapter" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    result = _synth(run, tmp_path / "s.csv", prompts, signing_key[0])
    assert result.exit_code == 3 and "adapter_model.safetensors" in result.output
    assert not (tmp_path / "s.csv").exists()


def test_no_dp_guarantee_is_in_every_output_of_a_control(runs, signing_key, tmp_path):
    _, control, prompts = runs
    out = tmp_path / "ctl.jsonl"
    result = _synth(control, out, prompts, signing_key[0], "--allow-non-private")
    assert result.exit_code == 0 and result.stdout.startswith(NO_DP_GUARANTEE)
    assert all(json.loads(line)[MARKER_COLUMN] == NO_DP_GUARANTEE for line in out.read_text().splitlines())
    assert not Path(str(out) + ".memorisation.json").exists()  # never beside the shippable file (issue 40)
    report = json.loads(next(control.with_name(control.name + ".private").glob("synth/ctl.jsonl.*")).read_text())
    assert report["dp_guarantee"] == NO_DP_GUARANTEE
    as_json = _synth(control, tmp_path / "ctl2.csv", prompts, signing_key[0], "--allow-non-private", "--json")
    doc = json.loads(as_json.stdout)
    assert doc["differentially_private"] is False and doc["guarantee"].startswith(NO_DP_GUARANTEE)
    check = _verify(control, out, signing_key[1], "--json")
    doc = json.loads(check.stdout)
    assert check.exit_code == 6 and doc["synthetic"]["guarantee"].startswith(NO_DP_GUARANTEE)


def test_synth_refuses_to_run_without_the_data_for_the_verbatim_check(tmp_path, tiny_model_dir, signing_key):
    data = tmp_path / "tickets.csv"
    data.write_text("message,reply\n" + "".join(f"question {i},answer {i}\n" for i in range(40)))
    run = train_ok(tmp_path, tiny_model_dir, data, signing_key, name="gone")
    data.unlink()  # the data owner moved the file: synth cannot flag verbatim rows, so it writes nothing
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    result = _synth(run, tmp_path / "s.csv", prompts, signing_key[0])
    assert result.exit_code == 2 and "needs the run's data" in result.output
    assert not (tmp_path / "s.csv").exists()
