"""FFA-LoRA (``lora.freeze_a``, issue 43; Sun et al., ICLR 2024): A stays at its seeded initialisation, only B is
trained, through ``dplora train`` on both per-example paths (fast and the Opacus reference).

Checked against references that can fail: the released A tensors equal a fresh peft initialisation under the
recorded seed bit for bit, every B moved from its zero init, each noise draw has exactly the number of B weights
(A gets no noise), the optimizer holds only B, and the signed record and ``dplora verify`` say A was frozen. The
per-example gradients themselves are compared to brute force in ``test_fastclip.py``.
"""

from __future__ import annotations

import pytest
from conftest import train_tiny

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


def test_freeze_a_must_be_a_boolean(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    result, _ = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, lora={"freeze_a": "yes"})
    assert result.exit_code == 2
    assert "freeze_a" in result.output and "Traceback" not in result.output
