"""examples/ci/github-actions.yml: parsed, then its shell steps run locally, in order, on demo data and the tiny
model. The fetch, install, restore and save steps (network, cloud store) are replaced by local stand-ins; every
step that runs dplora runs as written, through a ``dplora`` on PATH that is this checkout.

Two jobs: the ledger was restored (budget, train, verify pass; the charge is in the saved ledger), and it was not
(the job fails closed before training, and ``dplora train`` on its own refuses too, creating no ledger).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from conftest import release_statement

from dplora.contract.loader import load_contract

ROOT = Path(__file__).resolve().parents[2]


def _pinned_torch() -> str:
    """The top torch version pyproject allows (``torch>=…,<=X``): the version the workflow must install."""
    return re.search(r'"torch>=[^,]+,<=([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)


WORKFLOW = ROOT / "examples" / "ci" / "github-actions.yml"
STAND_INS = {"install", "fetch", "fetch-model", "restore-ledger", "save-ledger"}  # here: setup, network, stores


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _steps(workflow: dict) -> list[dict]:
    (job,) = workflow["jobs"].values()
    return job["steps"]


def test_workflow_shape(workflow):
    """Secrets only through env (never pasted into a script), one job at a time on the ledger, the ledger saved even
    after a failed run but only when it was restored, and no metrics (losses on private data) in the upload."""
    steps = {s.get("id"): s for s in _steps(workflow)}
    assert workflow["concurrency"]["cancel-in-progress"] is False
    for step in _steps(workflow):
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
    for step in _steps(workflow):
        if "uses" in step:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
    install = steps["install"]["run"]
    assert "scripts/setup.sh" not in install and "$DPLORA_PACKAGE" in install and "$TORCH_INDEX" in install
    assert "@" in workflow["env"]["DPLORA_PACKAGE"] and workflow["env"]["TORCH_INDEX"].startswith("https://")
    assert '"torch==$TORCH_VERSION"' in install  # an unpinned torch would be replaced by the index's CUDA build
    assert workflow["env"]["TORCH_VERSION"] == _pinned_torch()
    assert order.index("fetch-model") < order.index("budget")
    assert '"model.path=$MODEL_DIR"' in steps["train"]["run"] and '--base-model "$MODEL_DIR"' in steps["verify"]["run"]


class Job:
    """Runs a workflow's shell steps locally, as the runner would (bash -eo pipefail, env, expressions)."""

    def __init__(self, workflow: dict, workspace: Path, secrets: dict, variables: dict, env: dict):
        self.workflow, self.workspace = workflow, workspace
        self.temp = workspace.parent / "runner-temp"
        self.temp.mkdir()
        self.values = {
            "github.workspace": str(workspace),
            "runner.temp": str(self.temp),
            "github.run_id": "1",
            **{f"secrets.{k}": v for k, v in secrets.items()},
            **{f"vars.{k}": v for k, v in variables.items()},
        }
        shim = workspace.parent / "bin"
        shim.mkdir()
        (shim / "dplora").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m dplora "$@"\n')
        (shim / "dplora").chmod(0o755)
        self.env = {
            **os.environ,
            "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT),
            "RUNNER_TEMP": str(self.temp),
            "GITHUB_WORKSPACE": str(workspace),
            "GITHUB_PATH": str(self.temp / "github_path"),
            "DPLORA_DEBUG": "",
        }
        self.env.update({k: self.expand(v) for k, v in workflow["env"].items()})
        self.env.update(env)

    def expand(self, text: str) -> str:
        def value(match: re.Match) -> str:
            expr = match.group(1).strip()
            if expr not in self.values:
                pytest.fail(f"the workflow uses ${{{{ {expr} }}}}, which this test does not provide")
            return self.values[expr]

        return re.sub(r"\$\{\{(.*?)\}\}", value, str(text))

    def run(self, step: dict) -> subprocess.CompletedProcess:
        env = {**self.env, **{k: self.expand(v) for k, v in step.get("env", {}).items()}}
        return subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
            cwd=self.workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )


@pytest.fixture
def job_inputs(tmp_path, tiny_model_dir, signing_key, workflow):
    """A workspace with the shipped contract turned to the tiny model (one step), keys as secrets, a ledger store."""
    from dplora.data.demo import write_tickets

    workspace = tmp_path / "workspace"
    workspace.mkdir()
    raw = yaml.safe_load((ROOT / workflow["env"]["CONTRACT"]).read_text())
    raw["model"] = {"path": str(tiny_model_dir)}
    raw["privacy"].update(accountant="rdp", noise_multiplier=1.0, delta=1e-5)  # σ given: no calibration time
    raw["training"] = {**raw["training"], "expected_batch_size": 4, "physical_batch_size": 4, "threads": 1}
    raw["training"].pop("epochs")
    raw["training"]["steps"] = 1
    contract = workspace / "ci-contract.yaml"
    contract.write_text(yaml.safe_dump(raw))
    data_key = b"a data owner's key of 32 bytes!!"
    secrets = {
        "PRIVATE_DATA_URL": "https://example.invalid/tickets.csv",
        "PRIVATE_DATA_TOKEN": "token",
        "LEDGER_STORE": str(tmp_path / "store" / "ledger.sqlite3"),
        "DPLORA_SIGNING_KEY": signing_key[0].read_text().strip(),
        "DPLORA_DATA_KEY": data_key.decode(),
    }
    variables = {"DPLORA_PUBLIC_KEY": signing_key[1].read_text().strip(), "LEDGER_ROLE_ARN": "arn:test"}
    job = Job(workflow, workspace, secrets, variables, {"CONTRACT": str(contract), "MODEL_DIR": str(tiny_model_dir)})
    return job, secrets, write_tickets


def _run_job(job: Job, steps: list[dict], secrets: dict, write_tickets) -> tuple[list[str], dict]:
    """Run the steps until one fails (the runner's default); stand-ins replace fetch, restore and save."""
    ran, failed = [], {}
    for step in steps:
        sid = step.get("id")
        if sid == "fetch":
            write_tickets(job.workspace / job.env["DATA_PATH"], num_tickets=40, seed=2, max_turns=2)
        elif sid == "restore-ledger":
            store, ledger = Path(secrets["LEDGER_STORE"]), Path(job.env["DPLORA_LEDGER"])
            ledger.parent.mkdir(parents=True, exist_ok=True)
            if store.is_file():
                shutil.copy(store, ledger)  # else: a restore that "succeeded" without a file
        elif sid == "save-ledger":
            shutil.copy(job.env["DPLORA_LEDGER"], secrets["LEDGER_STORE"])
        elif "run" in step and sid not in STAND_INS:
            assert step.get("if", "always()") == "always()", step["name"]
            result = job.run(step)
            ran.append(sid)
            if result.returncode != 0:
                failed = {"id": sid, "code": result.returncode, "stderr": result.stderr, "stdout": result.stdout}
                break
            assert "Traceback" not in result.stderr
    return ran, failed


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
    ran, failed = _run_job(job, _steps(workflow), secrets, write_tickets)
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


def test_workflow_fails_closed_without_the_ledger(job_inputs, workflow):
    """Cap set, ledger not restored: the job stops before any dplora command; train alone refuses as well."""
    job, secrets, write_tickets = job_inputs
    steps = _steps(workflow)
    ran, failed = _run_job(job, steps, secrets, write_tickets)
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
