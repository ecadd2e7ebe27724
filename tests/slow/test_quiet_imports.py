"""The slow tier of tests/test_quiet_imports.py, whose docstring describes the module."""

import dplora  # noqa: F401  (installs the filter)


def test_importing_peft_prints_no_bitsandbytes_kernel_notice():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", "import dplora, peft"], capture_output=True, text=True, timeout=300, check=True
    )
    assert "gemm_4bit_forward" not in out.stderr
