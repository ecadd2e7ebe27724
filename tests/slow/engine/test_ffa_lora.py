"""The slow tier of tests/engine/test_ffa_lora.py, whose docstring describes the module."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import release_statement, train_tiny
from safetensors.torch import load_file

from dplora.mechanism import noise as noise_mod

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


def _fresh_lora_init(model_dir, seed: int) -> dict[str, torch.Tensor]:
    """peft's LoRA init of the tiny model under ``seed``, as dplora's setup draws it (r 2, alpha 4, q,v)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(seed)
    config = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], bias="none", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config, autocast_adapter_dtype=True)
    return {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" in n}


@pytest.mark.parametrize("per_sample", ["fast", "opacus"])
def test_freeze_a_trains_b_only_and_the_record_says_so(
    tmp_path, tiny_model_dir, tickets_csv, signing_key, monkeypatch, per_sample
):
    sizes: list[int] = []
    real_normal = noise_mod.CsprngGaussian.normal

    def spy(self, size, std, *, device="cpu"):
        sizes.append(int(size))
        return real_normal(self, size, std, device=device)

    monkeypatch.setattr(noise_mod.CsprngGaussian, "normal", spy)
    result, out = train_tiny(
        tmp_path,
        tiny_model_dir,
        tickets_csv,
        signing_key,
        lora={"freeze_a": True},
        privacy={"per_sample": per_sample},
        training={"seed": 7},
    )
    assert result.exit_code == 0, result.output
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    init = _fresh_lora_init(tiny_model_dir, 7)
    a_names = sorted(k for k in adapter if "lora_A" in k)
    b_names = sorted(k for k in adapter if "lora_B" in k)
    assert len(a_names) == len(b_names) == 2 * 2  # 2 layers · q, v
    by_suffix = {k.split("base_model.model.", 1)[-1].replace(".default", ""): v for k, v in init.items()}
    for k in a_names:
        ref = by_suffix[k.split("base_model.model.", 1)[-1]]
        assert torch.equal(adapter[k], ref), k  # A exactly at its seeded init: no update, no noise
    for k in b_names:
        assert float(by_suffix[k.split("base_model.model.", 1)[-1]].abs().max()) == 0.0  # peft's B init is zero
        assert float(adapter[k].abs().max()) > 0.0, k  # B trained
    b_count = sum(adapter[k].numel() for k in b_names)
    assert b_count == 2 * 2 * (16 * 2)
    assert sizes and set(sizes) == {b_count}  # every logical step's one draw covers B only
    lora = release_statement(out)["predicate"]["lora"]
    assert lora["freeze_a"] is True and lora["r"] == 2
    if per_sample == "fast":  # verify and the card (the same for both paths)
        from typer.testing import CliRunner

        from dplora.cli.app import app

        shown = CliRunner().invoke(app, ["verify", str(out), "--public-key", str(signing_key[1])])
        assert shown.exit_code == 0, shown.output
        assert "lora: A frozen (lora.freeze_a, FFA-LoRA)" in shown.output and "recorded seed 7" in shown.output
        as_json = CliRunner().invoke(app, ["verify", str(out), "--public-key", str(signing_key[1]), "--json"])
        assert json.loads(as_json.output)["claims"]["lora_freeze_a"] is True
        card = (out / "adapter" / "README.md").read_text()
        assert "A frozen at its seeded initialisation, only B trained (FFA-LoRA)" in card


def test_without_freeze_a_a_moves_and_the_record_says_false(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """The control of the test above: the same run without freeze_a trains A (so the equality above can fail)."""
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, training={"seed": 7})
    assert result.exit_code == 0, result.output
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    init = {
        k.split("base_model.model.", 1)[-1].replace(".default", ""): v
        for k, v in _fresh_lora_init(tiny_model_dir, 7).items()
    }
    a_names = [k for k in adapter if "lora_A" in k]
    assert any(not torch.equal(adapter[k], init[k.split("base_model.model.", 1)[-1]]) for k in a_names)
    assert release_statement(out)["predicate"]["lora"]["freeze_a"] is False
    from typer.testing import CliRunner

    from dplora.cli.app import app

    shown = CliRunner().invoke(app, ["verify", str(out), "--public-key", str(signing_key[1])])
    assert shown.exit_code == 0 and "freeze_a" not in shown.output
