"""PRV without torch (issue 29: ``dplora budget`` with the default accountant answers fast when warm)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_prv_epsilon_imports_neither_torch_nor_scipy_signal_and_matches_opacus():
    probe = (
        "import sys\n"
        "from dplora.accounting.backends import prv_epsilon\n"
        "from dplora.accounting import DpSgdEvent\n"
        "eps = prv_epsilon(DpSgdEvent(sample_rate=0.01, noise_multiplier=1.0, steps=300), 1e-5)\n"
        "print(eps, 'torch' in sys.modules, 'scipy.signal' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT)},
    ).stdout.split()
    assert out[1:] == ["False", "False"]
    # the same number as Opacus's own PRVAccountant (NOTES.md: 1.078 for q=0.01, σ=1, 300 steps, δ=1e-5)
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = [(1.0, 0.01, 300)]
    assert abs(float(out[0]) - acc.get_epsilon(delta=1e-5, eps_error=0.01)) < 1e-9
