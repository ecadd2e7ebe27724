"""The slow tier of tests/cli/test_ci_workflow.py, whose docstring describes the module."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from conftest import release_statement
from support.ci_workflow import WORKFLOW, build_job_inputs, run_job, shared_steps

from dplora.contract.loader import load_contract

ROOT = Path(__file__).resolve().parents[3]


def _pinned_torch() -> str:
    """The top torch version pyproject allows (``torch>=…,<=X``): the version the workflow must install."""
    return re.search(r'"torch>=[^,]+,<=([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_workflow_shape(workflow):
    """Secrets only through env (never pasted into a script), one job at a time on the ledger, the ledger saved even
    after a failed run but only when it was restored, and no metrics (losses on private data) in the upload."""
    steps = {s.get("id"): s for s in shared_steps(workflow)}
    assert workflow["concurrency"]["cancel-in-progress"] is False
    for step in shared_steps(workflow):
        assert "${{" not in step.get("run", ""), step["name"]
    assert "secrets.DPLORA_SIGNING_KEY" in steps["keys"]["env"]["SIGNING_KEY_PEM"]
    assert "secrets.DPLORA_DATA_KEY" in steps["keys"]["env"]["DATA_KEY"]
    assert steps["save-ledger"]["if"] == "always() && steps.restore-ledger.outcome == 'success'"
    order = list(steps)
    assert order.index("restore-ledger") < order.index("ledger-required") < order.index("budget")
    assert order.index("train") < order.index("verify") < order.index("stamp-reports") < order.index("upload")
    uploaded = steps["upload"]["with"]["path"]
    assert "release.dsse.json" in uploaded and "adapter/" in uploaded and "metrics" not in uploaded
    assert "--json" in steps["train"]["run"] and "--json" in steps["verify"]["run"]
    load_contract(ROOT / workflow["env"]["CONTRACT"])  # the shipped contract is valid
    # pasteable: every action pinned by commit, dplora and torch's build pinned in env, the team's own base model
    for step in shared_steps(workflow):
        if "uses" in step:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
    install = steps["install"]["run"]
    assert "scripts/setup.sh" not in install and "$DPLORA_PACKAGE" in install and "$TORCH_INDEX" in install
    assert "@" in workflow["env"]["DPLORA_PACKAGE"] and workflow["env"]["TORCH_INDEX"].startswith("https://")
    assert '"torch==$TORCH_VERSION"' in install  # an unpinned torch would be replaced by the index's CUDA build
    assert workflow["env"]["TORCH_VERSION"] == _pinned_torch()
    assert order.index("fetch-model") < order.index("budget")
    assert '"model.path=$MODEL_DIR"' in steps["train"]["run"] and '--base-model "$MODEL_DIR"' in steps["verify"]["run"]


@pytest.fixture
def job_inputs(tmp_path, tiny_model_dir, signing_key, workflow):
    return build_job_inputs(tmp_path, tiny_model_dir, signing_key, workflow)


def test_workflow_runs_locally_with_a_restored_ledger(job_inputs, workflow):
    """Budget, train and verify pass; each prints one JSON document; the saved ledger holds the run's charge."""
    from dplora.ledger.store import Ledger

    job, secrets, write_tickets = job_inputs
    store = Path(secrets["LEDGER_STORE"])
    store.parent.mkdir()
    with Ledger(store) as ledger:  # the administrator, once (closed: the one file holds the cap)
        ledger.set_cap(
            "support-customers",
            epsilon_max="10",
            delta_max="1e-4",
            protected_unit="user",
            unit_key="customer_id",
            adjacency="add_remove",
        )
    ran, failed = run_job(job, shared_steps(workflow), secrets, write_tickets)
    assert not failed, failed
    assert ran == [
        "ledger-required",
        "keys",
        "budget",
        "train",
        "verify",
        "stamp-reports",
        "cleanup",
    ]  # stand-ins aside
    reports = job.workspace / job.env["REPORTS_DIR"]
    started = release_statement(job.workspace / job.env["OUTPUT_DIR"])["predicate"]["started_at"]
    stamp = datetime.fromisoformat(started).timestamp()
    # the uploaded reports carry the record's start time, never the run's end (an artifact keeps mtimes)
    assert [int(p.stat().st_mtime) for p in (reports, reports / "train.json", reports / "verify.json")] == [
        int(stamp)
    ] * 3
    train = json.loads((reports / "train.json").read_text())
    verify = json.loads((reports / "verify.json").read_text())
    budget = json.loads((job.temp / "budget.json").read_text())
    assert train["ok"] and verify["ok"] and budget["ok"]
    assert budget["ledger"]["population"] == "support-customers" and budget["ledger"]["fits_cap"] is True
    assert train["steps_done"] == 1 and train["protected_unit"] == "user"
    assert {c["check"]: c["ok"] for c in verify["checks"]}["data digest"] is True
    assert verify["claims"]["run_id"] == train["run_id"]
    with Ledger(store) as ledger:
        (charge,) = ledger.charges("support-customers")
    assert charge.run_id == train["run_id"] and charge.status == "settled"
    assert float(charge.epsilon) == pytest.approx(train["epsilon_spent"])
    assert not Path(job.env["DPLORA_LEDGER"] + "-wal").exists()  # the one file holds every charge
    assert not (job.temp / "keys").exists() and not (job.workspace / job.env["DATA_PATH"]).exists()
