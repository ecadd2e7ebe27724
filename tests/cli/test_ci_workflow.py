"""examples/ci/github-actions.yml: parsed, then its shell steps run locally, in order, on demo data and the tiny
model. The fetch, install, restore and save steps (network, cloud store) are replaced by local stand-ins; every
step that runs dplora runs as written, through a ``dplora`` on PATH that is this checkout.

Two jobs: the ledger was restored (budget, train, verify pass; the charge is in the saved ledger), and it was not
(the job fails closed before training, and ``dplora train`` on its own refuses too, creating no ledger).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.ci_workflow import WORKFLOW, build_job_inputs, run_job, shared_steps

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


@pytest.fixture
def job_inputs(tmp_path, tiny_model_dir, signing_key, workflow):
    return build_job_inputs(tmp_path, tiny_model_dir, signing_key, workflow)


def test_workflow_fails_closed_without_the_ledger(job_inputs, workflow):
    """Cap set, ledger not restored: the job stops before any dplora command; train alone refuses as well."""
    job, secrets, write_tickets = job_inputs
    steps = shared_steps(workflow)
    ran, failed = run_job(job, steps, secrets, write_tickets)
    assert ran == ["ledger-required"] and failed["id"] == "ledger-required" and failed["code"] == 1
    assert "::error::privacy ledger not restored" in failed["stdout"]
    ledger = Path(job.env["DPLORA_LEDGER"])
    assert not ledger.exists()
    # without that guard (a restore step with `|| true`, say), dplora train refuses a missing ledger itself
    job.run(next(s for s in steps if s.get("id") == "keys"))
    result = job.run(next(s for s in steps if s.get("id") == "train"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: no ledger at")
    assert json.loads((job.workspace / job.env["REPORTS_DIR"] / "train.json").read_text())["exit_code"] == 2
    assert not ledger.exists() and not (job.workspace / job.env["OUTPUT_DIR"]).exists()
