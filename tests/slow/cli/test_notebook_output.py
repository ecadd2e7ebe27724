"""The slow tier of tests/cli/test_notebook_output.py, whose docstring describes the module."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import contract_dict, write_contract
from support.notebook_output import KERNEL_ENV

ROOT = Path(__file__).resolve().parents[3]


def _train_on_a_pty(cmd: list[str], env: dict, cwd: Path) -> tuple[int, str]:
    """Run ``cmd`` with stdin, stdout and stderr on one pseudo-terminal, as a notebook's ``!cmd`` does."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=follower, stdout=follower, stderr=follower, env=env, cwd=cwd)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO once the process has closed its side
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.wait(timeout=600), out.decode(errors="replace").replace("\r\n", "\n")


@pytest.mark.skipif(sys.platform == "win32", reason="IPython runs !cmd on a pseudo-terminal on POSIX only")
def test_train_on_a_kernels_pseudo_terminal_prints_no_private_line(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """Two real runs on a pseudo-terminal: without the kernel's environment the private lines are printed (it is a
    terminal); with it only the public lines and the one fixed line naming train.log."""
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "DPLORA_SHOW_PRIVATE", *KERNEL_ENV)}
    base.update(PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    outputs = {}
    for name, extra in (("terminal", {"TERM": "xterm-256color"}), ("notebook", KERNEL_ENV)):
        out = tmp_path / f"run-{name}"
        raw = contract_dict(tiny_model_dir, tickets_csv, out, data={"eval_fraction": 0.2}, training={"steps": 2})
        cfg = write_contract(tmp_path / f"{name}.yaml", raw)
        cmd = [sys.executable, "-m", "dplora", "train", str(cfg), "--signing-key", str(signing_key[0])]
        code, text = _train_on_a_pty(cmd, {**base, **extra}, tmp_path)
        assert code == 0, text[-3000:]
        outputs[name] = (out, text)
    out, text = outputs["terminal"]
    assert "private (not covered by DP): " in text and "loss/token" in text
    out, text = outputs["notebook"]
    assert "private (not covered by DP)" not in text and "loss/token" not in text and "loss " not in text
    assert "\x1b[" not in text  # no rich bar: plain progress lines
    notice = f"private diagnostics (held-out numbers, data notes; NOT covered by DP): {out}.private/train.log"
    assert f"{notice}; --show-private prints them" in text.splitlines()
    assert "loss/token" in (out.parent / f"{out.name}.private" / "train.log").read_text()
