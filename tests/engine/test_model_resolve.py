"""``load_base_model`` resolves the model once (review finding: it looked the model up twice with quantization none)."""

from __future__ import annotations

import torch

from dplora.contract.spec import ModelSection
from dplora.engine import model as model_mod


def test_load_base_model_resolves_the_model_once_and_loads_it(tiny_model_dir, monkeypatch):
    calls = []
    real = model_mod.resolve_model

    def counting(section, log=print):
        calls.append(section.path)
        return real(section, log)

    monkeypatch.setattr(model_mod, "resolve_model", counting)
    section = ModelSection(path=str(tiny_model_dir))
    model, tokenizer = model_mod.load_base_model(section, torch.device("cpu"), "fp32", False, log=lambda _: None)
    assert calls == [str(tiny_model_dir)]
    assert next(model.parameters()).dtype == torch.float32 and tokenizer.pad_token_id is not None
    reference, _ = model_mod.load_model_and_tokenizer(section, log=lambda _: None)  # the same weights as before
    ours, theirs = model.state_dict(), reference.state_dict()
    assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
