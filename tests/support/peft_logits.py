"""An adapter loaded two ways, compared on one prompt: shared by tests/slow/export/test_local_base.py and
tests/slow/release/test_interop.py."""

from __future__ import annotations

import torch


def logits_auto_manual_base(auto, manual) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits of one fixed prompt from ``auto`` (AutoPeftModelForCausalLM), ``manual`` (PeftModel over its base) and
    ``manual`` with the adapter disabled (the base model alone)."""
    ids = torch.tensor([[5, 17, 99, 200, 3]])
    with torch.no_grad():
        got, want = auto(input_ids=ids).logits, manual(input_ids=ids).logits
        with manual.disable_adapter():
            base = manual(input_ids=ids).logits
    return got, want, base
