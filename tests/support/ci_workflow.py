"""Helpers shared by tests/cli/test_ci_workflow.py and its slow tier under tests/slow/."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


WORKFLOW = ROOT / "examples" / "ci" / "github-actions.yml"


STAND_INS = {"install", "fetch", "fetch-model", "restore-ledger", "save-ledger"}  # here: setup, network, stores


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def shared_steps(workflow: dict) -> list[dict]:
    (job,) = workflow["jobs"].values()
    return job["steps"]


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


def build_job_inputs(tmp_path, tiny_model_dir, signing_key, workflow):
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


def run_job(job: Job, steps: list[dict], secrets: dict, write_tickets) -> tuple[list[str], dict]:
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
