"""`dplora generate` verifies the release first (issue 26.8), as `synth` does: a tampered adapter exits 3, no key
exits 2 unless `--no-verify`, and `--no-verify` says `unverified` on one line."""

from __future__ import annotations

import json

import pytest
from conftest import train_tiny
from typer.testing import CliRunner

from dplora.cli.app import app

runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")
PROMPT = ["--prompt", "where is my parcel", "--max-new-tokens", "3"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir, tickets_csv, signing_key):
    result, out = train_tiny(tmp_path_factory.mktemp("gen"), tiny_model_dir, tickets_csv, signing_key)
    assert result.exit_code == 0, result.output
    return out


def test_good_key_generates(run_dir, signing_key):
    result = runner.invoke(app, ["generate", str(run_dir), *PROMPT, "--public-key", str(signing_key[1]), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["prompt"] == "where is my parcel"
    assert "unverified" not in result.output


def test_tampered_adapter_exits_3_without_a_reply(run_dir, signing_key):
    weights = run_dir / "adapter" / "adapter_model.safetensors"
    original = weights.read_bytes()
    data = bytearray(original)
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    try:
        result = runner.invoke(app, ["generate", str(run_dir), *PROMPT, "--public-key", str(signing_key[1])])
    finally:
        weights.write_bytes(original)
    assert result.exit_code == 3, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "does not verify" in lines[0] and "Traceback" not in result.output


def test_another_signers_key_exits_3(run_dir, tmp_path):
    from dplora.release.keys import generate_keypair

    _, other = generate_keypair(tmp_path / "other.key")
    result = runner.invoke(app, ["generate", str(run_dir), *PROMPT, "--public-key", str(other)])
    assert result.exit_code == 3 and "does not verify" in result.output


def test_no_key_exits_2_naming_both_options(run_dir):
    result = runner.invoke(app, ["generate", str(run_dir), *PROMPT])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--public-key" in lines[0] and "--no-verify" in lines[0]


def test_key_and_no_verify_together_exit_2(run_dir, signing_key):
    result = runner.invoke(app, ["generate", str(run_dir), *PROMPT, "--public-key", str(signing_key[1]), "--no-verify"])
    assert result.exit_code == 2 and "not both" in result.output


def test_no_verify_prints_one_unverified_line(run_dir):
    result = runner.invoke(app, ["generate", str(run_dir), *PROMPT, "--no-verify", "--json"])
    assert result.exit_code == 0, result.output
    unverified = [line for line in result.output.splitlines() if "unverified" in line]
    assert len(unverified) == 1 and unverified[0].startswith("unverified:")
    assert json.loads(result.stdout.strip().splitlines()[-1])["prompt"] == "where is my parcel"
