"""The per-example path checked against a one-record backward before step 1 (issue 22, item 3).

The XLNet-style fault: a model whose LoRA-wrapped linear layers see (tokens, batch, features) tensors. Here a
tiny Llama's MLP is run on transposed activations (the same function, but gate/up/down_proj see (T, B, F)).
With ``per_sample: opacus`` Opacus then returns one "per-sample" gradient per *position*; when the padded length
equals the physical batch the rows even have the right count, and on main ``dplora train`` released it as DP.
"""

from __future__ import annotations

import csv
import re
from types import SimpleNamespace

import pytest
import torch
from conftest import release_statement, train_tiny
from peft import LoraConfig, get_peft_model
from tiny import tiny_causal_lm, tiny_llama

from dplora.engine import batch as batching
from dplora.engine import gradcheck, perexample
from dplora.errors import TrainingFailedError
from dplora.mechanism import optimizer as dpopt

TARGETS = ["q_proj", "v_proj", "down_proj"]
DOWN_PROJ = "base_model.model.model.layers.0.mlp.down_proj"


def _transposed_mlp(monkeypatch) -> None:
    """Every LlamaMLP runs on (tokens, batch, features): same outputs, per-position Opacus rows."""
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaMLP.forward
    monkeypatch.setattr(
        modeling_llama.LlamaMLP, "forward", lambda self, x: original(self, x.transpose(0, 1)).transpose(0, 1)
    )


def _private(per_sample: str, *, dropout: float = 0.1, dtype=torch.float32):
    model = tiny_llama(seed=0).to(dtype)
    config = LoraConfig(r=2, lora_alpha=4, lora_dropout=dropout, target_modules=TARGETS)
    peft_model = get_peft_model(model, config, autocast_adapter_dtype=True)
    for _, p in peft_model.named_parameters():
        if p.requires_grad:
            p.data = p.data.float()
    peft_model.train()
    named = [(n, p) for n, p in peft_model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([p for _, p in named], lr=0.1)
    plan = SimpleNamespace(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4, sample_rate=0.1)
    wrapped, dp_opt, accountant = dpopt.make_private(
        peft_model, optimizer, plan=plan, unit_mean=False, per_sample=per_sample
    )
    return wrapped, dp_opt, accountant, named


def _snapshot(model, named, dp_opt):
    return {
        "values": {n: p.detach().clone() for n, p in named},
        "buffers": [b.detach().clone() for b in model.buffers()],
        "modules": [(n, m) for n, m in model.named_modules()],
        "training": [m.training for m in model.modules()],
        "noise": dp_opt.generator.draws,
        "global_rng": torch.get_rng_state().clone(),
    }


@pytest.mark.parametrize("per_sample", ["fast", "opacus"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_check_passes_on_a_correct_path_and_restores_everything(per_sample, dtype):
    """Both synthetic batches (L ≠ B and L = B) agree with the one-record backward within rtol; afterwards the
    model, its dropout modules, modes and buffers, the noise generator, the global RNG and the accountant are
    exactly as before."""
    wrapped, dp_opt, accountant, named = _private(per_sample, dtype=dtype)
    before = _snapshot(wrapped, named, dp_opt)
    report = gradcheck.check_per_example_gradients(wrapped, named, dp_opt)
    assert [(r["records"], r["padded_tokens"]) for r in report] == [(3, 5), (3, 3), (3, 4)]
    rtol = gradcheck.RTOL_FP32 if dtype is torch.float32 else gradcheck.RTOL_HALF
    assert all(r["rtol"] == rtol and 0 <= r["max_relative_difference"] <= rtol for r in report), report
    if dtype is torch.float32:  # the tiny model agrees far inside the fp32 tolerance
        assert max(r["max_relative_difference"] for r in report) <= 1e-4, report
    after = _snapshot(wrapped, named, dp_opt)
    assert all(torch.equal(before["values"][n], after["values"][n]) for n, _ in named)  # lora_B still 0
    assert all(float(p.detach().abs().max()) == 0.0 for n, p in named if "lora_B" in n)
    assert all(torch.equal(a, b) for a, b in zip(before["buffers"], after["buffers"], strict=True))
    assert [(n, id(m)) for n, m in before["modules"]] == [(n, id(m)) for n, m in after["modules"]]
    assert before["training"] == after["training"]
    assert before["noise"] == after["noise"] and torch.equal(before["global_rng"], after["global_rng"])
    assert accountant.steps == 0 and dp_opt.accumulator.units == 0
    assert all(p.grad is None and getattr(p, "grad_sample", None) is None for _, p in named)
    assert gradcheck.probe_per_sample_gradients(wrapped, named, dp_opt) == report  # the run's call site


@pytest.mark.parametrize("per_sample", ["fast", "opacus"])
def test_transposed_layer_is_refused_when_padded_length_equals_batch(per_sample, monkeypatch):
    """L = B = 3: the row count is right, only the comparison with a one-record backward sees the fault."""
    _transposed_mlp(monkeypatch)
    wrapped, dp_opt, _, named = _private(per_sample)
    equal = [gradcheck.synthetic_batches(258)[1]]
    assert batching.collate(equal[0], 0)["input_ids"].shape == (3, 3)
    with pytest.raises(TrainingFailedError, match=re.escape(f"layer {DOWN_PROJ} (tensor {DOWN_PROJ}.lora_A")) as info:
        gradcheck.check_per_example_gradients(wrapped, named, dp_opt, batches=equal)
    message = str(info.value)
    assert info.value.exit_code == 4 and "\n" not in message
    assert "differs from a one-record backward" in message and "padded to 3 tokens" in message
    rel = float(re.search(r"relative difference ([0-9.e+-]+)", message).group(1))
    assert rel > 0.1  # a wrong path is off by O(1), far beyond any rounding tolerance
    assert all(p.grad is None for _, p in named)  # restored on the refusal too


def test_transposed_layer_with_other_padded_length_is_refused_by_row_count(monkeypatch):
    """L = 5 ≠ B = 3 with Opacus: 5 rows for 3 records, named before any value is compared."""
    _transposed_mlp(monkeypatch)
    wrapped, dp_opt, _, named = _private("opacus")
    with pytest.raises(TrainingFailedError, match=re.escape(f"{DOWN_PROJ}.lora_A.default.weight) got 5 per-sample")):
        gradcheck.probe_per_sample_gradients(wrapped, named, dp_opt)


def test_dropout_must_be_held_fixed_for_the_comparison(monkeypatch):
    """With LoRA dropout 0.5 the check passes because the masks are held fixed; with the model's own (random)
    dropout in both passes the same comparison refuses: the hold is needed and the check is sensitive to it."""
    wrapped, dp_opt, _, named = _private("fast", dropout=0.5)
    report = gradcheck.check_per_example_gradients(wrapped, named, dp_opt)
    assert max(r["max_relative_difference"] for r in report) <= 1e-4
    import contextlib

    monkeypatch.setattr(gradcheck, "_held_dropout", lambda model: contextlib.nullcontext([]))
    with pytest.raises(TrainingFailedError, match="differs from a one-record backward"):
        gradcheck.check_per_example_gradients(wrapped, named, dp_opt)


def test_fast_path_that_ignores_dropout_is_caught(monkeypatch):
    """A per-example formula that used the input before LoRA dropout (not the one the forward used) differs."""
    from dplora.engine import fastclip

    def undropped(layer, slot, adapter, x, *args, **kwargs):
        result = layer.base_layer(x, *args, **kwargs)
        _ = layer.lora_dropout[adapter](x)  # the forward drops out, the gradient formula sees x
        lora = fastclip._LoRAPerExample.apply(x, layer.lora_A[adapter].weight, layer.lora_B[adapter].weight, slot)
        return result + lora

    monkeypatch.setattr(fastclip, "_fast_forward", undropped)
    wrapped, dp_opt, _, named = _private("fast", dropout=0.5)
    with pytest.raises(TrainingFailedError, match="differs from a one-record backward"):
        gradcheck.check_per_example_gradients(wrapped, named, dp_opt)


def test_opacus_flat_refuses_rows_that_are_not_the_physical_batch():
    """grad_sample with 5 rows (positions) for a physical batch of 3 records: refused, not copied or cropped."""
    p = torch.nn.Parameter(torch.zeros(2, 4))
    p.grad_sample = torch.ones(5, 2, 4)
    with pytest.raises(TrainingFailedError, match=r"got 5 per-sample gradient rows for a physical batch of 3"):
        perexample.opacus_flat([p], expected_rows=3)
    p.grad_sample = torch.arange(24.0).view(3, 2, 4)
    out = perexample.opacus_flat([p], expected_rows=3)
    assert out.shape == (3, 8) and torch.equal(out[2], torch.arange(16.0, 24.0))


def _equal_length_data(path, rows: int = 12):
    """Records of exactly 6 tokens each ("ab\\n" + "cd" + EOS with the byte tokenizer)."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["message", "reply"])
        for i in range(rows):
            writer.writerow([chr(97 + i % 26) + chr(98 + i % 25), chr(99 + i % 24) + chr(100 + i % 23)])
    return path


def test_train_refuses_a_layer_that_sees_tokens_batch_features(tmp_path, tiny_model_dir, signing_key, monkeypatch):
    """End to end: per_sample opacus, every physical batch padded to 6 tokens = 6 records (q = 1, N = 12). On
    main this trained and released a record that verifies as DP; now exit 4 naming the layer, and no release."""
    _transposed_mlp(monkeypatch)
    data = _equal_length_data(tmp_path / "equal.csv")
    result, out = train_tiny(
        tmp_path,
        tiny_model_dir,
        data,
        signing_key,
        privacy={"per_sample": "opacus"},
        lora={"target_modules": TARGETS},
        training={"expected_batch_size": 12, "physical_batch_size": 6, "steps": 2},
    )
    released = (out / "release.dsse.json").exists()
    record = release_statement(out)["predicate"] if released else None
    assert result.exit_code == 4, (result.exit_code, result.output[-800:], record and record["accounting"])
    assert not released and not out.exists()
    assert f"layer {DOWN_PROJ}" in result.output and "got 5 per-sample gradient rows" in result.output
    assert "Traceback" not in result.output


# One attention projection or one MLP projection alone, per architecture of tests/engine/test_architectures.py.
SINGLE_TARGETS = {
    "llama": ["q_proj", "k_proj", "o_proj", "down_proj"],
    "qwen2": ["q_proj", "k_proj", "o_proj", "up_proj"],
    "mistral": ["q_proj", "k_proj", "o_proj", "gate_proj"],
    "gemma2": ["q_proj", "k_proj", "o_proj", "down_proj"],
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
}


def _single_target(arch: str, target: str, per_sample: str = "fast", *, hidden: int = 128, layers: int = 4):
    base, _ = tiny_causal_lm(arch, hidden=hidden, layers=layers)
    peft_model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=[target])).train()
    named = [(n, p) for n, p in peft_model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([p for _, p in named], lr=0.1)
    plan = SimpleNamespace(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4, sample_rate=0.1)
    wrapped, dp_opt, _ = dpopt.make_private(peft_model, optimizer, plan=plan, unit_mean=False, per_sample=per_sample)
    return wrapped, dp_opt, named


@pytest.mark.parametrize(
    ("arch", "target"), [(arch, target) for arch, targets in SINGLE_TARGETS.items() for target in targets]
)
def test_single_projection_targets_pass(arch, target):
    """Issue 41.5 / 48.1: q-only, k-only, o-only and MLP-only LoRA pass the check (hidden 128, 4 layers, where
    fp32 rounding is visible). On main q_proj or k_proj alone was refused on the repeated-token batch, where every
    query/key gradient is mathematically zero: "relative difference 1.11 > 0.005" (llama q_proj; 8 of the 22
    cases). The distinct-token batch has non-zero gradients for every target, so q/k are really compared there."""
    wrapped, dp_opt, named = _single_target(arch, target)
    rows, references = [], []
    judge, reference = gradcheck._judge, gradcheck._plain_reference

    def spy(differences, params, names, rtol, floor, i, size, width):
        rows.append((width, sum(base for _, base in differences), floor))
        return judge(differences, params, names, rtol, floor, i, size, width)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gradcheck, "_judge", spy)
        mp.setattr(gradcheck, "_plain_reference", lambda *a: references.append(reference(*a)) or references[-1])
        report = gradcheck.check_per_example_gradients(wrapped, named, dp_opt)
    assert [r["padded_tokens"] for r in report] == [5, 3, 4]
    assert all(r["max_relative_difference"] <= gradcheck.RTOL_FP32 for r in report), report
    floor = rows[0][2]
    distinct = [base for width, base, _ in rows if width == 4]
    assert len(distinct) == 3 and min(distinct) > 10 * floor  # compared far above the floor there
    # relative to the check's own scale (no fixed absolute floor): 1e-2 of its largest reference row
    assert floor == pytest.approx(gradcheck.FLOOR_REL * max(float(r.norm()) for r in references), rel=1e-12)
    assert floor > 0 and all(f == floor for *_, f in rows)


def _per_token_norm_write(monkeypatch):
    """A planted fast path that clips with per-token norms: each row block keeps its direction but gets the norm
    √Σ_t ‖g_t‖²‖x_t‖² (no cross-token terms; cases F1: 1.41 instead of 2 for two equal tokens)."""
    from dplora.engine import fastclip

    original = fastclip._Slot.write

    def write(self, gbs, x, g, hs):
        G = self.owner._armed
        first = self.generation != self.owner._generation  # the first write overwrites (the buffer is empty)
        before = torch.zeros_like(G) if first else G.clone()
        original(self, gbs, x, g, hs)
        rows = G.shape[0]
        for lo, a, b in ((self.off_a, gbs, x), (self.off_b, g, hs)):
            n = a.shape[2] * b.shape[2]
            true = G[:, lo : lo + n] - before[:, lo : lo + n]
            per_token = ((a.float() ** 2).sum(2) * (b.float() ** 2).sum(2)).sum(1).sqrt()  # (B,)
            scale = per_token / true.norm(dim=1).clamp_min(1e-30)
            G[:, lo : lo + n] = before[:, lo : lo + n] + true * scale.view(rows, 1)

    monkeypatch.setattr(fastclip._Slot, "write", write)


@pytest.mark.parametrize("target", ["v_proj", "down_proj"])
def test_per_token_norm_error_fails_on_the_repeated_batch(target, monkeypatch):
    """Issue 48.1: the repeated-token batch ([4, 4, 6], [8, 10], [9, 9, 9]) is kept and, alone, still refuses a
    fast path whose norms are per token (the floor does not hide it); the same model passes without the plant."""
    repeated = [gradcheck.synthetic_batches(258)[1]]
    assert [ids for ids, _ in repeated[0]] == [[4, 4, 6], [8, 10], [9, 9, 9]]
    wrapped, dp_opt, named = _single_target("llama", target)
    assert (
        gradcheck.check_per_example_gradients(wrapped, named, dp_opt, batches=repeated)[0]["max_relative_difference"]
        <= 1e-3
    )
    _per_token_norm_write(monkeypatch)
    wrapped, dp_opt, named = _single_target("llama", target)
    with pytest.raises(TrainingFailedError, match=r"padded to 3 tokens: relative difference") as info:
        gradcheck.check_per_example_gradients(wrapped, named, dp_opt, batches=repeated)
    rel = float(re.search(r"relative difference ([0-9.e+-]+)", str(info.value)).group(1))
    assert rel > 0.1, str(info.value)
    # [9, 9, 9] alone, the F1 record (equal inputs, aligned upstream gradients: 1.41 instead of 2 for two tokens)
    with pytest.raises(TrainingFailedError, match=r"record 0 of a synthetic batch of 1 records padded to 3 tokens"):
        gradcheck.check_per_example_gradients(wrapped, named, dp_opt, batches=[[repeated[0][2]]])


def _single_target_half(target: str, per_sample: str = "fast"):
    """:func:`_single_target` on a bf16 base (fp32 LoRA tensors, as ``setup_model`` makes them)."""
    base, _ = tiny_causal_lm("llama", hidden=128, layers=4)
    peft_model = get_peft_model(
        base.to(torch.bfloat16), LoraConfig(r=2, lora_alpha=4, target_modules=[target]), autocast_adapter_dtype=True
    ).train()
    for _, p in peft_model.named_parameters():
        if p.requires_grad:
            p.data = p.data.float()
    named = [(n, p) for n, p in peft_model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([p for _, p in named], lr=0.1)
    plan = SimpleNamespace(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4, sample_rate=0.1)
    wrapped, dp_opt, _ = dpopt.make_private(peft_model, optimizer, plan=plan, unit_mean=False, per_sample=per_sample)
    return wrapped, dp_opt, named


@pytest.mark.parametrize("target", ["v_proj", "down_proj"])
def test_per_token_norm_error_fails_in_bf16(target, monkeypatch):
    """The coarser bf16 floor does not hide a wrong path: on a bf16 base the per-token norm plant is still refused
    on the repeated-token batch (off by O(1)), and the same model without the plant passes with margin."""
    repeated = [gradcheck.synthetic_batches(258)[1]]
    wrapped, dp_opt, named = _single_target_half(target)
    report = gradcheck.check_per_example_gradients(wrapped, named, dp_opt, batches=repeated)
    assert report[0]["rtol"] == gradcheck.RTOL_HALF and report[0]["floor_rel"] == gradcheck.FLOOR_REL_HALF
    assert report[0]["max_relative_difference"] <= 1e-2
    _per_token_norm_write(monkeypatch)
    wrapped, dp_opt, named = _single_target_half(target)
    with pytest.raises(TrainingFailedError, match=r"padded to 3 tokens: relative difference") as info:
        gradcheck.check_per_example_gradients(wrapped, named, dp_opt, batches=repeated)
    rel = float(re.search(r"relative difference ([0-9.e+-]+)", str(info.value)).group(1))
    assert rel > gradcheck.RTOL_HALF, str(info.value)


def test_floor_depends_on_the_dtype():
    """A zero block that differs by 5e-3 of the check's largest row (bf16 resolution: unit roundoff 3.9e-3) passes
    under bf16's floor and is refused under fp32's, where rtol·floor is 5e-5 of the largest row."""
    fp32, _, _, _ = _private("fast")
    half, _, _, _ = _private("fast", dtype=torch.bfloat16)
    assert gradcheck._tolerance(fp32) == (gradcheck.RTOL_FP32, gradcheck.FLOOR_REL) == (5e-3, 1e-2)
    assert gradcheck._tolerance(half) == (gradcheck.RTOL_HALF, gradcheck.FLOOR_REL_HALF) == (1e-1, 1e-1)
    p = torch.nn.Parameter(torch.zeros(2))
    names = {id(p): "layer.lora_A.default.weight"}
    largest = 2.0  # the check's largest reference row norm
    zero_block = [(5e-3 * largest, 0.0)]  # ‖g − r‖ = 5e-3 of the largest row, ‖r‖ = 0
    rtol, floor_rel = gradcheck._tolerance(half)
    rel = gradcheck._judge(zero_block, [p], names, rtol, floor_rel * largest, 0, 3, 3)
    assert rel == pytest.approx(5e-2)  # 5e-3 / 0.1 of the largest row
    rtol, floor_rel = gradcheck._tolerance(fp32)
    with pytest.raises(TrainingFailedError, match=r"relative difference 0.5 > 0.005"):
        gradcheck._judge(zero_block, [p], names, rtol, floor_rel * largest, 0, 3, 3)


@pytest.mark.parametrize("fail", [False, True])
def test_tf32_is_off_during_the_check_and_restored(fail):
    """The caller's TF32 flags (here on, as ``model.allow_tf32`` sets them on CUDA) read False in every backward of
    the check and are back afterwards, on a refusal too."""
    wrapped, dp_opt, _, named = _private("fast")
    seen = []
    loss = batching.per_sequence_loss

    def spying_loss(model, batch):
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        if fail and len(seen) == 2:
            raise TrainingFailedError("planted")
        return loss(model, batch)

    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # flags, not attributes
    try:
        if fail:
            with pytest.raises(TrainingFailedError, match="planted"):
                gradcheck.check_per_example_gradients(wrapped, named, dp_opt, loss=spying_loss)
        else:
            report = gradcheck.check_per_example_gradients(wrapped, named, dp_opt, loss=spying_loss)
            assert len(report) == 3 and len(seen) == 3 * (1 + 3)  # per batch: one batched, three one-record passes
        after = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    assert seen and set(seen) == {(False, False)}
    assert after == (True, True)


def test_the_check_logs_its_largest_relative_difference():
    """The run's call site logs one public line: the largest relative difference of the report, its rtol and floor
    (synthetic batches only; no record text)."""
    wrapped, dp_opt, _, named = _private("fast", dtype=torch.bfloat16)
    lines: list[str] = []
    report = gradcheck.probe_per_sample_gradients(wrapped, named, dp_opt, log=lines.append)
    worst = max(r["max_relative_difference"] for r in report)
    assert lines == [
        f"per-example check: largest relative difference {worst:.3g} (rtol 0.1, floor 0.1 of the largest row; "
        "3 synthetic batches, TF32 off)"
    ]
    assert gradcheck.probe_per_sample_gradients(wrapped, named, dp_opt) == report  # no log: the same check, silent
