"""scripts/peer_opacus.py (issue 43's peer row): plain Opacus + peft with the Opacus LoRA tutorial's recipe, Poisson
sampling, the study's ε, δ, accountant, data and evaluation."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from conftest import SHARED

ROOT = Path(__file__).resolve().parents[3]
HAS_DATA = (SHARED / "data" / "bitext_customer_support").is_dir()
pytestmark = [
    pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore:Secure RNG turned off:UserWarning", "ignore:Optimal order:UserWarning"),
]


def _peer():
    spec = importlib.util.spec_from_file_location("peer_opacus", ROOT / "scripts" / "peer_opacus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["peer_opacus"] = module
    spec.loader.exec_module(module)
    return module


def _toy_lora(peer, tmp_path, **recipe):
    """The toy chat model with the tutorial's LoRA (``recipe`` overrides), B matrices of the last layer randomised
    so that A's gradients are not zero."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = peer.bench_module().toy_model(tmp_path / "toy")
    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model, targets, trained = peer.lora_model(base, peer.Recipe(**recipe))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and "lora_B" in name:
                p.normal_(0, 0.5)
    return model, tokenizer, targets, trained


def _examples(tokenizer, count: int):
    """(input_ids, labels) pairs of different lengths, the first tokens of each a prompt (label −100)."""
    import random

    rng = random.Random(0)
    out = []
    for i in range(count):
        n = 6 + 3 * i
        ids = [rng.randrange(0, 250) for _ in range(n)]
        out.append((ids, [-100] * (n // 2) + ids[n // 2 :]))
    return out


def test_ghost_clipped_sum_matches_brute_force_per_sequence_clipping(tmp_path):
    """The tutorial's ghost-clipping criterion, fed as :func:`batch_loss` feeds it (shifted logits flattened with
    ``shape``, targets positional), gives exactly Σ_i clip_C(∇ per-sequence loss_i), each example alone and unpadded
    (dplora's per-sequence loss): padding and prompt tokens masked, no coupling between examples."""
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    from dplora.engine.batch import collate, per_sequence_loss

    peer = _peer()
    model, tokenizer, targets, trained = _toy_lora(peer, tmp_path, lora_dropout=0.0)
    assert targets == ["q_proj", "v_proj"]
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert params and all(".layers.1." in n and "lora_" in n for n in params)  # the last of 2 layers only
    assert trained == sum(p.numel() for p in params.values())
    examples = _examples(tokenizer, 5)
    model.train()
    grads = []
    for ex in examples:
        model.zero_grad()
        per_sequence_loss(model, collate([ex], tokenizer.pad_token_id)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in params.items()})
    norms = [torch.sqrt(sum(g.pow(2).sum() for g in grad.values())).item() for grad in grads]
    low = sorted(norms)
    clip = (low[1] + low[2]) / 2  # two examples under C, three clipped: a loss scale error would show
    expected = {n: sum(g[n] * min(1.0, clip / (m + 1e-6)) for g, m in zip(grads, norms, strict=True)) for n in params}
    model.zero_grad()
    dataset = peer.padded_dataset(examples, tokenizer.pad_token_id, 40)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    module, optimizer, criterion, loader = PrivacyEngine(accountant="prv").make_private(
        module=model,
        optimizer=optimizer,
        data_loader=DataLoader(dataset, batch_size=len(examples)),
        criterion=torch.nn.CrossEntropyLoss(reduction="mean"),
        noise_multiplier=0.0,
        max_grad_norm=clip,
        grad_sample_mode="ghost",
        poisson_sampling=False,
    )
    batch = next(iter(loader))
    assert batch[0].shape == (5, 40) and (batch[2][:, -1] == -100).all()  # right padding, masked
    loss = peer.batch_loss(module, criterion, batch)
    loss.backward()
    for n, p in params.items():
        torch.testing.assert_close(p.grad, expected[n], rtol=1e-4, atol=1e-7)


def test_an_empty_poisson_batch_still_steps_noise_and_the_accountant(tmp_path):
    import torch

    peer = _peer()
    model, tokenizer, _, _ = _toy_lora(peer, tmp_path)
    dataset = peer.padded_dataset(_examples(tokenizer, 8), tokenizer.pad_token_id, 40)
    recipe = peer.Recipe(batch_size=4)
    engine, module, optimizer, criterion, loader = peer.make_private(
        model, dataset, recipe=recipe, epsilon=8.0, delta=1e-5, accountant="prv"
    )
    assert type(loader).__name__ == "DPDataLoader"  # Poisson sampling
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    empty = (torch.zeros((0, 40), dtype=torch.long),) * 2 + (torch.full((0, 40), -100),)
    assert peer.step(module, optimizer, criterion, empty) is None
    assert engine.accountant.history == [(optimizer.noise_multiplier, 0.5, 1)]
    moved = [not torch.equal(p, before[n]) for n, p in model.named_parameters() if p.requires_grad]
    assert all(moved)  # noise (σ > 0) reached every trained tensor


@pytest.mark.skipif(not HAS_DATA, reason="no data")
def test_toy_peer_row_is_private_poisson_sampled_scored_and_appended(tmp_path):
    """--toy end to end: the tutorial's B 32 and 3 epochs on TOY_FULL's 160 Bitext rows (q = 1/5, T = 15), ε spent
    ≤ 8 and exactly what Opacus's PRV accountant gives for the row's q, σ and T, Poisson batch sizes that vary,
    only the last layer's LoRA trained, and the row appended to the JSON and the table given."""
    import torch
    from opacus.accountants import PRVAccountant
    from safetensors.torch import load_file

    peer = _peer()
    out, js, md = tmp_path / "p", tmp_path / "study.json", tmp_path / "page.md"
    md.write_text("# page\n\nkept text\n")
    row = peer.main(["--toy", "--out", str(out), "--study-json", str(js), "--study-md", str(md)])
    assert row["levers"] == ["peer-opacus"] and row["epsilon"] == 8.0 and row["lr"] == 5e-4
    assert row["batch"] == 32 and row["q"] == pytest.approx(0.2) and row["steps"] == 15  # 3 epochs of 1/q batches
    assert 7.9 < row["epsilon_spent"] <= 8.0
    accountant = PRVAccountant()
    accountant.history = [(row["sigma"], row["q"], row["steps"])]
    assert abs(accountant.get_epsilon(delta=1e-5) - row["epsilon_spent"]) < 1e-6
    sizes = row["poisson_batch_sizes"]["every_step"]
    assert len(sizes) == 15 and len(set(sizes)) > 1 and all(0 <= s <= 160 for s in sizes)
    assert row["recipe"]["poisson_sampling"] is True and row["recipe"]["accountant"] == "prv"
    weights = load_file(str(out / "runs" / "peer-opacus" / "adapter" / "adapter_model.safetensors"))
    last = {k: v for k, v in weights.items() if ".layers.1." in k}
    assert sum(v.numel() for v in last.values()) == row["trained_parameters"] == 2048
    assert all(torch.count_nonzero(v) > 0 for v in last.values())  # trained (B starts at 0)
    assert all(torch.count_nonzero(v) == 0 for k, v in weights.items() if ".layers.0." in k and "lora_B" in k)
    assert row["heldout_rows"] == 6 and row["validation_rows"] == 200
    assert math.isfinite(row["heldout_loss"]) and row["heldout_loss"] != row["base_heldout_loss"]
    assert row["share_of_control_gain"] == pytest.approx((3.0793 - row["heldout_loss"]) / (3.0793 - 1.4329), abs=1e-4)
    assert json.loads(js.read_text()) == [json.loads(json.dumps(row))]
    text = md.read_text()
    assert text.startswith("# page\n\nkept text\n")
    table = text.split(peer.bench_module().STUDY_START)[1].split(peer.bench_module().STUDY_END)[0]
    line = next(x for x in table.splitlines() if x.startswith("| peer-opacus |"))
    assert "| 2,048 | 32 | 15 |" in line and f"| {row['epsilon_spent']:.3f} |" in line
