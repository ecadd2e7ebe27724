"""Tests of dplora.mechanism.optimizer: per-sample gradients, per-unit clipping, noise, accounting and failed runs.

Every number is checked against an independent reference: a brute-force backward of one example at a time on
an unwrapped copy of the model, a clipped sum computed by hand, or the moments of the Gaussian. The model is a
tiny random Llama (hidden 16, 2 layers) with peft LoRA r=4 on q_proj and v_proj.
"""

from __future__ import annotations

import copy
import math
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from peft import LoraConfig, get_peft_model
from support.lora import ALL_PROMPT, IGNORE, PAD, RECORDS, randomize_lora_b
from tiny import tiny_llama

from dplora.engine import batch as batching
from dplora.engine import gradcheck, perexample
from dplora.errors import TrainingFailedError
from dplora.mechanism import optimizer as dpopt
from dplora.mechanism.noise import CsprngGaussian

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


def _lora_model(*, lora_b_std: float = 0.3, seed: int = 0):
    """Tiny peft LoRA Llama in train mode; lora_B ~ N(0, std²) so lora_A gets gradients (0: peft's zeros)."""
    model = tiny_llama(seed=seed)
    model.to("cpu")  # on its device BEFORE get_peft_model (cases T1)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    peft_model = get_peft_model(model, config)
    if lora_b_std:
        return randomize_lora_b(peft_model, seed + 1, lora_b_std)
    return peft_model.train()


def _trainable(model) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _plan(*, sigma=0.0, clip=1.0, batch=4, q=0.5):
    return SimpleNamespace(noise_multiplier=sigma, max_grad_norm=clip, expected_batch_size=batch, sample_rate=q)


def _private(model, *, lr=0.0, unit_mean=False, per_sample="opacus", **plan):
    named = _trainable(model)
    optimizer = torch.optim.SGD([p for _, p in named], lr=lr)
    gsm, dp_opt, accountant = dpopt.make_private(
        model, optimizer, plan=_plan(**plan), unit_mean=unit_mean, per_sample=per_sample
    )
    return gsm, dp_opt, accountant, named


def _brute_force(model, examples) -> list[dict[str, torch.Tensor]]:
    """Each example's gradient alone: forward/backward of a batch of 1, no padding, on an unwrapped copy."""
    reference = copy.deepcopy(model)
    out = []
    for example in examples:
        reference.zero_grad(set_to_none=True)
        batching.per_sequence_loss(reference, batching.collate([example], PAD)).sum().backward()
        out.append(
            {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in _trainable(reference)}
        )
    return out


def _flat(grads: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([grads[n].reshape(-1).double() for n in names])


def _hand_loss(model, example) -> float:
    """Mean next-token NLL over the targets of one unpadded example, by log_softmax + gather in float64."""
    ids, labels = example
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].double()
    logp = torch.log_softmax(logits, dim=-1)
    terms = [-logp[t, y] for t, y in enumerate(labels[1:]) if y != IGNORE]
    return float(sum(terms) / len(terms)) if terms else 0.0


def _logical_step(gsm, dp_opt, records, units, physical, *, apply=False) -> dict[str, torch.Tensor]:
    """One logical step over ``records`` (a local unit id per record) in physical batches of ``physical``.

    Returns:
        {parameter name: p.grad · expected_batch_size}, i.e. the clipped (noised) sum before normalisation.
    """
    dp_opt.begin_logical_step(max(units) + 1 if units else 0)
    for start in range(0, len(records), physical):
        batch = batching.collate(records[start : start + physical], PAD)
        dp_opt.prepare_batch(batch["input_ids"].shape[0])
        batching.per_sequence_loss(gsm, batch).sum().backward()
        _accumulate(dp_opt, units, start, min(start + physical, len(units)))
    dp_opt.step() if apply else dp_opt.pre_step()
    names = [n for n, _ in _trainable(perexample.unwrap(gsm))]
    out = {n: p.grad.detach().clone() * dp_opt.expected_batch_size for n, p in zip(names, dp_opt.params, strict=True)}
    dp_opt.zero_grad(set_to_none=True)
    return out


def _accumulate(dp_opt, units: list[int], start: int, end: int) -> None:
    """Fold records start..end-1 (local unit ids ``units``, contiguous per unit) into the step, as the loop does."""
    counts = {u: units.count(u) for u in units}
    dp_opt.accumulate(
        torch.tensor(units[start:end], dtype=torch.long),
        continues=end < len(units) and units[end] == units[end - 1],
        row_weight=torch.tensor([1.0 / counts[u] for u in units[start:end]]),
    )


def _clipped_sum(per_record: list[torch.Tensor], groups: list[list[int]], clip: float, mean=False) -> torch.Tensor:
    """Hand reference: sum (or average) each unit's record gradients, clip the flat vector to C, sum units."""
    total = torch.zeros_like(per_record[0])
    for group in groups:
        s = sum(per_record[r] for r in group)
        if mean:
            s = s / len(group)
        total += s * min(1.0, clip / float(s.norm()))
    return total


@pytest.fixture(scope="module")
def pristine():
    """A LoRA model never wrapped by Opacus; tests wrap deep copies of it."""
    return _lora_model()


@pytest.fixture(scope="module")
def record_grads(pristine):
    """Brute-force per-record flat gradients of RECORDS (float64), with the trainable names in order."""
    names = [n for n, _ in _trainable(pristine)]
    return names, [_flat(g, names) for g in _brute_force(pristine, RECORDS)]


def _flat_out(grads: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return _flat(grads, names)


def test_per_sample_grads_match_brute_force(pristine):
    """grad_sample[i] of every trainable LoRA tensor equals example i's own batch-1 backward (fp32, ~1e-7)."""
    model = copy.deepcopy(pristine)
    examples = RECORDS[:4]
    expected = _brute_force(model, examples)
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum")
    losses = batching.per_sequence_loss(gsm, batching.collate(examples, PAD))
    losses.sum().backward()
    named = _trainable(model)
    assert len(named) == 8 and all("lora_" in n for n, _ in named)
    for i, example in enumerate(examples):
        assert float(losses[i].detach()) == pytest.approx(_hand_loss(model, example), abs=1e-5)
    for name, p in named:
        assert p.grad_sample.shape == (len(examples), *p.shape)
        for i in range(len(examples)):
            torch.testing.assert_close(p.grad_sample[i], expected[i][name], rtol=1e-4, atol=1e-7)
    # The reference is sharp: the examples' gradients differ far beyond the tolerance.
    names = [n for n, _ in named]
    flat = torch.stack([_flat(e, names) for e in expected])
    assert float((flat[0] - flat[1]).norm()) > 0.1 * float(flat[0].norm()) > 1e-3


def _pad_to(batch: dict[str, torch.Tensor], width: int) -> dict[str, torch.Tensor]:
    extra = width - batch["input_ids"].shape[1]
    return {
        "input_ids": F.pad(batch["input_ids"], (0, extra), value=PAD),
        "attention_mask": F.pad(batch["attention_mask"], (0, extra), value=0),
        "labels": F.pad(batch["labels"], (0, extra), value=IGNORE),
    }


def test_padding_width_changes_nothing_and_all_prompt_is_zero(pristine):
    """T3: widths 8 and 16 give equal per-sequence losses and per-sample grads; all-prompt gives 0 and 0."""
    model = copy.deepcopy(pristine)
    examples = [*RECORDS[:4], ALL_PROMPT]
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum")
    named = _trainable(model)
    results = {}
    for width in (8, 16):
        batch = _pad_to(batching.collate(examples, PAD), width)
        assert batch["input_ids"].shape == (5, width)
        losses = batching.per_sequence_loss(gsm, batch)
        losses.sum().backward()
        results[width] = (losses.detach(), {n: p.grad_sample.clone() for n, p in named})
        for _, p in named:
            p.grad_sample, p.grad = None, None
    (loss8, gs8), (loss16, gs16) = results[8], results[16]
    torch.testing.assert_close(loss8, loss16, rtol=1e-5, atol=1e-6)
    for i, example in enumerate(examples):
        assert float(loss8[i]) == pytest.approx(_hand_loss(model, example), abs=1e-5)
    for name, _ in named:
        torch.testing.assert_close(gs8[name], gs16[name], rtol=1e-4, atol=1e-7)
        assert torch.count_nonzero(gs8[name][4]) == 0 and torch.count_nonzero(gs16[name][4]) == 0
    assert float(loss8[4]) == 0.0
    assert all(float(gs8[n][:4].abs().max()) > 0 for n, _ in named)


# Three units over RECORDS[:7], delivered unit by unit; with physical batches of 3, unit 0 (four records) and
# unit 2 each span two physical batches.
UNITS = [[0, 2, 4, 5], [1], [3, 6]]


def _flatten_units(groups: list[list[int]]) -> tuple[list, list[int]]:
    """Records unit by unit (each unit's records contiguous, as the sampler delivers them), with local unit ids."""
    order = [(r, u) for u, g in enumerate(groups) for r in g]
    return [RECORDS[r] for r, _ in order], [u for _, u in order]


@pytest.mark.parametrize("per_sample", ["opacus", "fast"])
@pytest.mark.parametrize("unit_mean", [False, True])
def test_unit_clipping_matches_hand_reference(pristine, record_grads, unit_mean, per_sample):
    """Clipped unit sum over two physical batches equals Σ_u clip_C(sum or mean of u's brute-force grads)."""
    names, per_record = record_grads
    sums = [sum(per_record[r] for r in g) / (len(g) if unit_mean else 1) for g in UNITS]
    norms = sorted(float(s.norm()) for s in sums)
    clip = norms[1]  # the median unit: one unit is clipped, one is not
    expected = _clipped_sum(per_record, UNITS, clip, mean=unit_mean)
    gsm, dp_opt, _, _ = _private(
        copy.deepcopy(pristine), clip=clip, batch=5, unit_mean=unit_mean, per_sample=per_sample
    )
    records, units = _flatten_units(UNITS)
    got = _flat_out(_logical_step(gsm, dp_opt, records, units, physical=3), names)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(
        dp_opt.last_unit_norms.double(),
        torch.tensor([float(s.norm()) for s in sums], dtype=torch.float64),
        rtol=1e-4,
        atol=1e-7,
    )
    assert norms[0] < clip * 0.999 and norms[2] > clip * 1.001
    # Per-record clipping or no clipping would both be far from the reference.
    unclipped = sum(sums)
    assert float((unclipped - expected).norm()) > 1e-3


@pytest.mark.parametrize("per_sample", ["opacus", "fast"])
@pytest.mark.parametrize("clip_case", ["clipped", "unclipped"])
def test_removing_a_unit_moves_sum_by_at_most_c(pristine, record_grads, clip_case, per_sample):
    """Add/remove: dropping unit 0 (4 records) changes the clipped sum by ‖clip(S₀)‖, exactly C if ‖S₀‖>C."""
    names, per_record = record_grads
    s0 = float(sum(per_record[r] for r in UNITS[0]).norm())
    clip = (
        0.25 * s0 if clip_case == "clipped" else 1.5 * max(float(sum(per_record[r] for r in g).norm()) for g in UNITS)
    )
    gsm, dp_opt, _, _ = _private(copy.deepcopy(pristine), clip=clip, batch=3, per_sample=per_sample)
    full = _flat_out(_logical_step(gsm, dp_opt, *_flatten_units(UNITS), physical=4), names)
    without = _flat_out(_logical_step(gsm, dp_opt, *_flatten_units(UNITS[1:]), physical=4), names)
    change = float((full - without).norm())
    assert change <= clip + 1e-6
    if clip_case == "clipped":
        assert change == pytest.approx(clip, abs=1e-5)
    else:
        assert change == pytest.approx(s0, rel=1e-4)
    torch.testing.assert_close(without, _clipped_sum(per_record, [[1], [3, 6]], clip), rtol=1e-4, atol=1e-7)


def test_replacing_a_unit_moves_sum_by_at_most_2c(pristine, record_grads):
    """Replace-one: swapping unit 0's records for two other records changes the clipped sum by ≤ 2C."""
    names, per_record = record_grads
    old = sum(per_record[r] for r in UNITS[0])
    new = per_record[7] + per_record[8]
    clip = 0.1 * min(float(old.norm()), float(new.norm()), float((old - new).norm()))
    assert float((old - new).norm()) > 2 * clip  # without the clip the bound would fail
    gsm, dp_opt, _, _ = _private(copy.deepcopy(pristine), clip=clip, batch=3)
    before = _flat_out(_logical_step(gsm, dp_opt, *_flatten_units(UNITS), physical=4), names)
    replaced_groups = [[7, 8], [1], [3, 6]]
    records = [RECORDS[r] for g in replaced_groups for r in g]
    units = [u for u, g in enumerate(replaced_groups) for _ in g]
    after = _flat_out(_logical_step(gsm, dp_opt, records, units, physical=4), names)
    torch.testing.assert_close(after, _clipped_sum(per_record, replaced_groups, clip), rtol=1e-4, atol=1e-7)
    change = float((before - after).norm())
    expected = float((old / old.norm() - new / new.norm()).norm()) * clip
    assert change <= 2 * clip + 1e-6
    assert change == pytest.approx(expected, rel=1e-4)


def _scalar_step(dp_opt, num_units, physical_batches) -> float:
    """Drive UnitDPOptimizer on a 1-parameter module: grad_sample set by hand per physical batch."""
    (p,) = dp_opt.params
    dp_opt.begin_logical_step(num_units)
    every = [u for _, units in physical_batches for u in units]
    start = 0
    for grads, units in physical_batches:
        p.grad_sample = torch.tensor(grads).view(-1, 1, 1)
        _accumulate(dp_opt, every, start, start + len(units))
        start += len(units)
    dp_opt.pre_step()
    value = float(p.grad)
    dp_opt.zero_grad(set_to_none=True)
    return value


@pytest.mark.parametrize("unit_mean", [False, True])
def test_alice_and_bao_example(unit_mean):
    """Seeds' example: Alice [0.5, 5.0], Bao [0.25], C=1, normalizer 2 → 0.625; removing Alice: −0.500."""
    lin = torch.nn.Linear(1, 1, bias=False)
    _, dp_opt, _ = dpopt.make_private(
        lin, torch.optim.SGD(lin.parameters(), lr=0.0), plan=_plan(clip=1.0, batch=2), unit_mean=unit_mean
    )
    # Alice's records land in two physical batches.
    both = _scalar_step(dp_opt, 2, [([0.5], [0]), ([5.0, 0.25], [0, 1])])
    assert both == pytest.approx(0.625, abs=1e-6)  # per-record clipping would give (0.5 + 1 + 0.25) / 2 = 0.875
    assert dp_opt.last_unit_norms.tolist() == pytest.approx([2.75 if unit_mean else 5.5, 0.25])
    without = _scalar_step(dp_opt, 1, [([0.25], [0])])
    assert without == pytest.approx(0.125, abs=1e-7)
    assert both - without == pytest.approx(0.5, abs=1e-6)
    # Below the clip the two rules differ: Alice [0.5, 1.0] sums to 1.5 → 1, but averages to 0.75.
    small = _scalar_step(dp_opt, 2, [([0.5, 1.0, 0.25], [0, 0, 1])])
    assert small == pytest.approx((0.75 + 0.25) / 2 if unit_mean else (1.0 + 0.25) / 2, abs=1e-6)


def test_tiny_clip_bounds_the_update(pristine, record_grads):
    """T7: σ=0, C=1e-6, SGD lr 1: the flat update is at most U·C/B although raw unit norms are ~10⁵·C."""
    _, per_record = record_grads
    clip, batch = 1e-6, 2
    gsm, dp_opt, _, named = _private(copy.deepcopy(pristine), lr=1.0, clip=clip, batch=batch)
    before = {n: p.detach().clone() for n, p in named}
    _logical_step(gsm, dp_opt, *_flatten_units(UNITS), physical=4, apply=True)
    delta = torch.cat([(p.detach() - before[n]).reshape(-1).double() for n, p in named])
    bound = len(UNITS) * clip / batch
    assert float(delta.norm()) <= bound * (1 + 1e-6)
    assert float(delta.norm()) > 0.1 * clip / batch  # it moved, by about the clip
    for n, p in named:
        assert float((p.detach() - before[n]).norm()) <= bound * (1 + 1e-6)
    assert float(dp_opt.last_unit_norms.min()) > 1e3 * clip
    assert min(float(sum(per_record[r] for r in g).norm()) for g in UNITS) > 1e3 * clip


def test_noise_std_is_sigma_c_on_empty_batch():
    """Empty step: p.grad·B is N(0, (σC)²); sample mean and std of 10⁴ draws within 5 standard errors."""
    sigma, clip, batch = 1.5, 0.4, 8
    lin = torch.nn.Linear(100, 100, bias=False)
    _, dp_opt, accountant = dpopt.make_private(
        lin,
        torch.optim.SGD(lin.parameters(), lr=0.0),
        plan=_plan(sigma=sigma, clip=clip, batch=batch),
        unit_mean=False,
    )
    dp_opt.begin_logical_step(0)
    dp_opt.step()
    z = lin.weight.grad.reshape(-1).double() * batch
    n, sd = z.numel(), sigma * clip
    assert n == 10_000
    assert abs(float(z.mean())) < 5 * sd / math.sqrt(n)  # OS-entropy noise: 5 SE, ~1e-6 flake rate
    assert abs(float(z.std()) / sd - 1) < 5 / math.sqrt(2 * n)
    assert accountant.steps == 1


def test_noise_drawn_once_per_logical_step(pristine, monkeypatch):
    """One draw of P values per logical step (not per physical batch, not per tensor), std σC, OS-entropy generator."""
    calls = []
    real = CsprngGaussian.normal

    def counting(self, size, std, *, device="cpu"):
        calls.append((std, (size,), self))
        return real(self, size, std, device=device)

    monkeypatch.setattr(CsprngGaussian, "normal", counting)
    gsm, dp_opt, accountant, named = _private(copy.deepcopy(pristine), sigma=0.7, clip=2.0, batch=3)
    total = sum(p.numel() for _, p in named)
    records, units = _flatten_units(UNITS)
    dp_opt.begin_logical_step(3)
    for start in range(0, len(records), 3):  # 7 records: three physical batches
        batching.per_sequence_loss(gsm, batching.collate(records[start : start + 3], PAD)).sum().backward()
        _accumulate(dp_opt, units, start, min(start + 3, len(units)))
    assert calls == []  # nothing drawn per physical batch
    dp_opt.step()
    dp_opt.zero_grad(set_to_none=True)
    assert calls == [(pytest.approx(1.4), (total,), dp_opt.generator)] and dp_opt.generator is not None
    _logical_step(gsm, dp_opt, records, units, physical=2, apply=True)  # four physical batches
    assert len(calls) == 2 and accountant.steps == 2


def test_noise_does_not_follow_the_global_seed():
    """Same torch.manual_seed before make_private, different noise; os_entropy_generator ignores the seed."""
    grads, weights = [], []
    for _ in range(2):
        torch.manual_seed(0)
        lin = torch.nn.Linear(20, 20, bias=False)
        _, dp_opt, _ = dpopt.make_private(
            lin,
            torch.optim.SGD(lin.parameters(), lr=0.0),
            plan=_plan(sigma=1.0, clip=1.0, batch=1),
            unit_mean=False,
        )
        dp_opt.begin_logical_step(0)
        dp_opt.step()
        grads.append(lin.weight.grad.clone())
        weights.append(lin.weight.detach().clone())
    assert torch.equal(weights[0], weights[1])  # the seed did make everything else identical
    assert float((grads[0] - grads[1]).abs().max()) > 0.1
    draws = []
    for _ in range(2):
        torch.manual_seed(0)
        draws.append(dpopt.os_entropy_generator().normal(8, 1.0))
    torch.manual_seed(0)
    seeded = torch.randn(8)
    assert not torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], seeded) and not torch.equal(draws[1], seeded)


def test_accountant_counts_every_logical_step_including_empty(pristine):
    """StepAccountant history equals the logical steps taken (empties included); noise moves every tensor."""
    gsm, dp_opt, accountant, named = _private(copy.deepcopy(pristine), lr=0.1, sigma=1.0, clip=1.0, batch=2, q=0.01)
    plan_units = [0, 2, 0, 0, 1]
    for num_units in plan_units:
        before = [p.detach().clone() for _, p in named]
        if num_units:
            groups = [[1], [3]][:num_units]
            _logical_step(gsm, dp_opt, [RECORDS[g[0]] for g in groups], list(range(num_units)), 4, apply=True)
        else:
            dp_opt.begin_logical_step(0)
            dp_opt.step()
            dp_opt.zero_grad(set_to_none=True)
        assert all(float((p.detach() - b).abs().max()) > 0 for (_, p), b in zip(named, before, strict=True))
    assert accountant.steps == len(plan_units)
    assert accountant.history == [(1.0, 0.01, len(plan_units))]


def test_first_step_moves_every_lora_tensor_and_check_names_stuck_one():
    """T1: with noise every tensor (lora_B starts at 0) moves; check_all_moved names a tensor that did not."""
    model = _lora_model(lora_b_std=0.0)
    assert all(float(p.detach().abs().max()) == 0 for n, p in _trainable(model) if "lora_B" in n)  # peft's init
    gsm, dp_opt, _, named = _private(model, lr=0.05, sigma=1.0, clip=1.0, batch=2)
    before = {n: p.detach().clone() for n, p in named}
    _logical_step(gsm, dp_opt, RECORDS[:2], [0, 1], 4, apply=True)
    assert all(float((p.detach() - before[n]).abs().max()) > 0 for n, p in named)
    gradcheck.check_all_moved(before, named)  # passes
    stuck = named[3][0]
    partial = {n: p.detach().clone() if n == stuck else p.detach() + 1.0 for n, p in named}
    with pytest.raises(TrainingFailedError, match=re.escape(stuck)):
        gradcheck.check_all_moved(partial, named)
    with pytest.raises(TrainingFailedError, match=re.escape(named[0][0])):
        gradcheck.check_all_moved({n: p.detach().clone() for n, p in named}, named)


def test_without_noise_lora_a_is_stuck_at_step_one():
    """T1 reference: lora_B = 0 gives lora_A zero gradient, so with σ=0 check_all_moved names a lora_A."""
    model = _lora_model(lora_b_std=0.0)
    gsm, dp_opt, _, named = _private(model, lr=0.05, sigma=0.0, clip=1.0, batch=2)
    before = {n: p.detach().clone() for n, p in named}
    _logical_step(gsm, dp_opt, RECORDS[:2], [0, 1], 4, apply=True)
    assert all(float((p.detach() - before[n]).abs().max()) > 0 for n, p in named if "lora_B" in n)
    with pytest.raises(TrainingFailedError, match=r"lora_A"):
        gradcheck.check_all_moved(before, named)


def test_probe_names_unused_trainable_parameter():
    """T2: a trainable but unused layer gets no per-sample gradient; the probe names its parameter."""
    model = _lora_model()
    model.base_model.model.unused_head = torch.nn.Linear(2, 2)
    gsm, _, _, named = _private(model)
    with pytest.raises(TrainingFailedError, match=re.escape("base_model.model.unused_head.weight")):
        gradcheck.probe_per_sample_gradients(gsm, named)


def test_trainable_parameter_on_module_with_buffers_fails_before_training():
    """T6: a trainable tensor directly on LlamaModel (it holds buffers) is refused, naming path and class."""
    model = _lora_model()
    model.base_model.model.model.register_parameter("stray", torch.nn.Parameter(torch.zeros(3)))
    with pytest.raises(TrainingFailedError, match=re.escape("base_model.model.model (LlamaModel)")) as info:
        _private(model)
    assert info.value.exit_code == 4 and "\n" not in str(info.value)


def test_trainable_rmsnorm_matches_brute_force():
    """T6: a trainable final LlamaRMSNorm works (functorch fallback); its grad_sample equals brute force."""
    model = _lora_model()
    norm = model.base_model.model.model.norm
    assert type(norm).__name__ == "LlamaRMSNorm"
    norm.weight.requires_grad_(True)
    examples = RECORDS[:4]
    expected = _brute_force(model, examples)
    gsm, _, _, named = _private(model)
    gradcheck.probe_per_sample_gradients(gsm, named)  # does not raise
    batching.per_sequence_loss(gsm, batching.collate(examples, PAD)).sum().backward()
    assert "base_model.model.model.norm.weight" in dict(named)
    for name, p in named:
        for i in range(len(examples)):
            torch.testing.assert_close(p.grad_sample[i], expected[i][name], rtol=1e-4, atol=1e-7)
    assert float(norm.weight.grad_sample.abs().max()) > 1e-3


def test_gradient_checkpointing_is_refused():
    """make_private refuses a model with gradient checkpointing on (it re-fires forward hooks)."""
    model = _lora_model()
    model.base_model.model.gradient_checkpointing_enable()
    with pytest.raises(TrainingFailedError, match="checkpointing"):
        _private(model)
