"""Tests of dplora.engine.fastclip and dplora.mechanism.clipping against one-example-at-a-time brute force.

The reference: each record alone, trimmed to its real length, its own autograd gradient of
``batching.per_sequence_loss`` on an unmodified copy of the peft model (stock peft forward), flattened over all LoRA
tensors in ``named_parameters`` order; units are summed (or averaged), clipped to C in flat L2 and summed by hand.
Noise is off, fp32 on CPU. The model is a tiny random Llama (hidden 16, 2 layers) with peft LoRA.
"""

from __future__ import annotations

import copy

import pytest
import torch
from opacus import GradSampleModule
from peft import LoraConfig, get_peft_model
from support.architectures import unit_batches
from support.lora import ALL_7, ALL_PROMPT, IGNORE, PAD, ReplayDropout, randomize_lora_b
from support.lora import RECORDS as LORA_RECORDS
from tiny import tiny_llama
from torch.utils._python_dispatch import TorchDispatchMode

from dplora.engine import batch as batching
from dplora.engine.fastclip import FlatLoRAGrads
from dplora.engine.perexample import assign_flat_grads, opacus_flat
from dplora.errors import TrainingFailedError, UncoveredParameterError
from dplora.mechanism import optimizer as dpopt
from dplora.mechanism.clipping import UnitClipAccumulator
from dplora.mechanism.noise import privatize

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)

# (input_ids, labels): different lengths (right padding), masked prompts, one record with no target token.
RECORDS = [*LORA_RECORDS[:4], ALL_PROMPT, *LORA_RECORDS[5:]]


def _lora_model(*, targets=("q_proj", "v_proj"), dropout=0.0, dtype=torch.float32, seed=0):
    """Tiny peft LoRA Llama in train mode; lora_B ~ N(0, 0.3²) so that lora_A gets gradients too."""
    model = tiny_llama(seed=seed).to(dtype)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=list(targets))
    peft_model = get_peft_model(model, config)
    for name, p in peft_model.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()  # LoRA in fp32 whatever the base dtype
    return randomize_lora_b(peft_model, seed + 1)


def _trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def _brute_force(model, records) -> torch.Tensor:
    """(N, P): each record alone (trimmed), its own autograd gradient, flat over the trainable tensors."""
    rows = []
    for i, record in enumerate(records):
        for m in model.modules():
            if isinstance(m, ReplayDropout):
                m.example = i
        loss = batching.per_sequence_loss(model, batching.collate([record], PAD))[0]
        grads = torch.autograd.grad(loss, _trainable(model), allow_unused=True)
        rows.append(
            torch.cat(
                [
                    (g if g is not None else torch.zeros_like(p)).flatten().float()
                    for g, p in zip(grads, _trainable(model), strict=True)
                ]
            )
        )
    return torch.stack(rows)


def _fast_grads(model, flat, records) -> torch.Tensor:
    G = flat.buffer(len(records))
    batching.per_sequence_loss(model, batching.collate(records, PAD)).sum().backward()
    assert flat.gradients() is G
    return G.clone()


def _clip(v: torch.Tensor, c: float) -> torch.Tensor:
    return v * min(1.0, c / (float(v.norm()) + 1e-6))


def _reference_sum(per_record, groups, c, mean=False) -> torch.Tensor:
    total = torch.zeros(per_record.shape[1])
    for g in groups:
        v = per_record[g].sum(0) / (len(g) if mean else 1)
        total += _clip(v, c)
    return total


def _logical_step(model, flat, records, groups, physical, c, *, mean=False):
    """Records of each unit contiguous, cut into physical batches; returns (clipped sum, norms)."""
    acc = UnitClipAccumulator(flat.P, c, "cpu")
    acc.begin_step()
    for chunk, ids, continues in unit_batches(groups, physical):
        flat.buffer(len(chunk))
        batching.per_sequence_loss(model, batching.collate([records[r] for r in chunk], PAD)).sum().backward()
        weight = torch.tensor([1.0 / len(groups[u]) for u in ids.tolist()]) if mean else None
        acc.add(flat.gradients(), ids, last_unit_continues=continues, row_weight=weight)
    total, norms = acc.finish()
    return total.clone(), norms


@pytest.fixture(scope="module")
def pristine():
    return _lora_model()


@pytest.fixture(scope="module")
def reference(pristine):
    return _brute_force(copy.deepcopy(pristine), RECORDS)


# ----------------------------------------------------------------------------------------- per-example gradients


def test_row_level_matches_brute_force_with_padding_prompts_and_clipping(pristine, reference):
    """G equals the per-record brute force; the clipped sum equals Σ clip_C(g_i) with some records clipped."""
    model = copy.deepcopy(pristine)
    flat = FlatLoRAGrads(model)
    assert (
        flat.P == sum(p.numel() for p in _trainable(model)) == 2 * 2 * (4 * 16 + 16 * 4)
    )  # layers · targets · (A + B)
    G = _fast_grads(model, flat, RECORDS)
    assert (G - reference).abs().max() < 1e-5
    assert float(reference[4].abs().max()) == 0.0  # the all-prompt record: zero gradient
    norms = reference.norm(dim=1)
    c = float(norms[norms > 0].median())
    assert int((norms > c).sum()) >= 3 and int(((norms > 0) & (norms < c)).sum()) >= 3
    total, got_norms = _logical_step(model, flat, RECORDS, [[i] for i in range(len(RECORDS))], 4, c)
    assert (got_norms - norms).abs().max() < 1e-5
    assert (total - _reference_sum(reference, [[i] for i in range(len(RECORDS))], c)).abs().max() < 1e-5
    assert all(p.grad is None for p in _trainable(model))  # no ordinary .grad: the caller writes it


def test_padding_width_changes_nothing(pristine, reference):
    model = copy.deepcopy(pristine)
    flat = FlatLoRAGrads(model)
    batch = batching.collate(RECORDS, PAD)
    extra = 6
    batch = {
        "input_ids": torch.nn.functional.pad(batch["input_ids"], (0, extra), value=PAD),
        "attention_mask": torch.nn.functional.pad(batch["attention_mask"], (0, extra), value=0),
        "labels": torch.nn.functional.pad(batch["labels"], (0, extra), value=IGNORE),
    }
    flat.buffer(len(RECORDS))
    batching.per_sequence_loss(model, batch).sum().backward()
    assert (flat.gradients() - reference).abs().max() < 1e-5


@pytest.mark.parametrize(
    "groups, physical",
    [
        ([[0, 1], [2, 3, 4], [5], [6, 7, 8]], 4),  # units 1 and 3 cross a batch boundary
        ([[0], [1, 2, 3, 4, 5, 6], [7, 8]], 3),  # unit 1 spans three batches, one of them wholly
    ],
)
@pytest.mark.parametrize("mean", [False, True])
def test_unit_level_split_across_physical_batches(pristine, reference, groups, physical, mean):
    model = copy.deepcopy(pristine)
    flat = FlatLoRAGrads(model)
    unit_vectors = torch.stack([reference[g].sum(0) / (len(g) if mean else 1) for g in groups])
    c = float(unit_vectors.norm(dim=1).median())
    total, norms = _logical_step(model, flat, RECORDS, groups, physical, c, mean=mean)
    assert (norms - unit_vectors.norm(dim=1)).abs().max() < 1e-5
    assert (total - _reference_sum(reference, groups, c, mean)).abs().max() < 1e-5
    assert int((unit_vectors.norm(dim=1) > c).sum()) >= 1


def test_lora_dropout_is_exact_per_example(pristine):
    """Wide LoRA with dropout 0.5: row b of G is the gradient of the forward that ran, with its own masks."""
    model = _lora_model(targets=ALL_7, dropout=0.5)
    reference_model = copy.deepcopy(model)
    flat = FlatLoRAGrads(model)
    masks = {}

    def capture(name):
        def hook(module, inputs, output):
            masks[name] = (output != 0).float() / (1 - module.p)  # where the input is 0 any mask replays it

        return hook

    handles = [
        m.lora_dropout["default"].register_forward_hook(capture(name))
        for name, m in model.named_modules()
        if hasattr(m, "lora_dropout") and isinstance(m.lora_dropout["default"], torch.nn.Dropout)
    ]
    assert len(handles) == 2 * 7
    G = _fast_grads(model, flat, RECORDS)
    for name, m in reference_model.named_modules():
        if name in masks:
            m.lora_dropout["default"] = ReplayDropout(masks[name])
    reference = _brute_force(reference_model, RECORDS)
    assert float(reference.abs().max()) > 0.05
    assert (G - reference).abs().max() < 1e-5
    # the masks matter: the gradient without dropout differs
    for m in reference_model.modules():
        if hasattr(m, "lora_dropout"):
            m.lora_dropout["default"] = torch.nn.Identity()
    assert (_brute_force(reference_model, RECORDS) - reference).abs().max() > 1e-2


def test_bf16_base_norms_match_bf16_brute_force():
    """bf16 base weights, fp32 LoRA: per-example norms within 1 % of the same bf16 model one record at a time."""
    model = _lora_model(targets=ALL_7, dtype=torch.bfloat16)
    assert all(p.dtype == torch.float32 for p in _trainable(model))
    assert model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight.dtype == torch.bfloat16
    reference = _brute_force(copy.deepcopy(model), RECORDS)
    flat = FlatLoRAGrads(model)
    G = _fast_grads(model, flat, RECORDS)
    assert G.dtype == torch.float32
    norms, ref_norms = G.norm(dim=1), reference.norm(dim=1)
    real = ref_norms > 0
    assert float(((norms[real] - ref_norms[real]).abs() / ref_norms[real]).max()) < 1e-2
    assert float(norms[~real].max()) == 0.0
    assert float((G - reference).norm() / reference.norm()) < 2e-2


def test_matches_opacus_grad_sample_in_the_same_layout(pristine):
    """opacus_flat(Opacus hooks' grad_sample) equals FlatLoRAGrads' G: the two paths share the accumulator."""
    fast_model = _lora_model(targets=ALL_7)
    opacus_model = copy.deepcopy(fast_model)
    flat = FlatLoRAGrads(fast_model)
    G = _fast_grads(fast_model, flat, RECORDS)
    gsm = GradSampleModule(opacus_model, batch_first=True, loss_reduction="sum")
    batching.per_sequence_loss(gsm, batching.collate(RECORDS, PAD)).sum().backward()
    params = [p for n, p in opacus_model.named_parameters() if p.requires_grad]
    assert [n for n, _ in flat.named_params] == [n for n, p in opacus_model.named_parameters() if p.requires_grad]
    assert (opacus_flat(params) - G).abs().max() < 1e-5
    assert all(p.grad_sample is None for p in params)


def _ffa(model):
    """FFA-LoRA (lora.freeze_a): the recipe's own freeze, on a tiny model."""
    from dplora.engine.lora import freeze_lora_a

    return freeze_lora_a(model)


def test_ffa_lora_b_columns_match_brute_force_and_a_gets_none(pristine, reference):
    """lora.freeze_a: G holds the B columns only, equal to per-record autograd with A frozen, and to the B columns
    of the full brute force (freezing A does not change B's gradient); A gets no per-example gradient or .grad."""
    model = copy.deepcopy(pristine)
    frozen = _ffa(model)
    assert len(frozen) == 4 and all(".lora_A." in n for n in frozen)
    brute = _brute_force(copy.deepcopy(model), RECORDS)  # autograd over the trainable (B) tensors only, stock peft
    flat = FlatLoRAGrads(model)
    names = [n for n, _ in flat.named_params]
    assert names and all(".lora_B." in n for n in names)
    assert flat.P == 2 * 2 * (16 * 4)  # layers · targets · B only
    G = _fast_grads(model, flat, RECORDS)
    assert brute.shape == G.shape and (G - brute).abs().max() < 1e-5
    full_names = [n for n, p in pristine.named_parameters() if p.requires_grad]
    cols, off = [], 0
    for n, p in pristine.named_parameters():
        if p.requires_grad:
            if ".lora_B." in n:
                cols += range(off, off + p.numel())
            off += p.numel()
    assert len(full_names) == 8 and (G - reference[:, cols]).abs().max() < 1e-5
    assert float(G.abs().max()) > 0
    assert all(p.grad is None for n, p in model.named_parameters() if ".lora_A." in n)


def test_ffa_lora_opacus_reference_path_agrees(pristine):
    """The Opacus path with A frozen: grad_sample only on B, equal to the fast path's G in the same layout."""
    fast_model = _lora_model(targets=ALL_7)
    _ffa(fast_model)
    opacus_model = copy.deepcopy(fast_model)
    flat = FlatLoRAGrads(fast_model)
    G = _fast_grads(fast_model, flat, RECORDS)
    gsm = GradSampleModule(opacus_model, batch_first=True, loss_reduction="sum")
    batching.per_sequence_loss(gsm, batching.collate(RECORDS, PAD)).sum().backward()
    params = [p for n, p in opacus_model.named_parameters() if p.requires_grad]
    assert len(params) == 2 * 7 and flat.P == sum(p.numel() for p in params)
    assert all(getattr(p, "grad_sample", None) is None for n, p in opacus_model.named_parameters() if "lora_A" in n)
    assert (opacus_flat(params) - G).abs().max() < 1e-5


def test_ffa_lora_refuses_a_trainable_a_with_a_frozen_b():
    model = _lora_model()
    for n, p in model.named_parameters():
        if ".lora_B." in n:
            p.requires_grad_(False)
    with pytest.raises(UncoveredParameterError, match="lora_A.*its B is frozen"):
        FlatLoRAGrads(model)


# ------------------------------------------------------------------------------------------ refusals and misuse


def test_refuses_a_trainable_tensor_it_does_not_cover():
    model = _lora_model()
    model.base_model.model.model.norm.weight.requires_grad_(True)
    with pytest.raises(UncoveredParameterError, match=r"model\.norm\.weight"):
        FlatLoRAGrads(model)
    assert all("forward" not in m.__dict__ for m in model.modules())  # nothing installed


def test_refuses_dora():
    model = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    with pytest.raises(UncoveredParameterError, match="lora_magnitude_vector|lora_A"):
        FlatLoRAGrads(model)


def test_backward_without_armed_buffer_and_missing_slices_are_errors(pristine):
    model = copy.deepcopy(pristine)
    flat = FlatLoRAGrads(model)
    batch = batching.collate(RECORDS[:3], PAD)
    with pytest.raises(TrainingFailedError, match="no armed buffer"):
        batching.per_sequence_loss(model, batch).sum().backward()
    flat.buffer(2)
    with pytest.raises(TrainingFailedError, match="batch 3, buffer 2"):
        batching.per_sequence_loss(model, batch).sum().backward()
    flat.buffer(3)
    with pytest.raises(TrainingFailedError, match="got no per-example gradient"):
        flat.gradients()  # no backward ran: every slice is stale


def test_remove_restores_peft(pristine):
    model = copy.deepcopy(pristine)
    batch = batching.collate(RECORDS, PAD)
    with torch.no_grad():
        before = batching.per_sequence_loss(model, batch)
    flat = FlatLoRAGrads(model)
    with torch.no_grad():
        assert (batching.per_sequence_loss(model, batch) - before).abs().max() < 1e-6
    flat.remove()
    batching.per_sequence_loss(model, batch).sum().backward()
    assert all(p.grad is not None for p in _trainable(model))


def test_assign_flat_grads_are_views_and_privatize_noise_is_sigma_c_over_e():
    params = [torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(5))]
    flat = torch.arange(17, dtype=torch.float32)
    assign_flat_grads(params, flat)
    assert params[1].grad[0] == 12 and params[0].grad.data_ptr() == flat.data_ptr()
    with pytest.raises(ValueError):
        assign_flat_grads(params, torch.zeros(18))
    gen = dpopt.os_entropy_generator()
    noisy = privatize(
        torch.full((200_000,), 4.0), noise_multiplier=1.5, max_grad_norm=2.0, expected_batch_size=4.0, generator=gen
    )
    assert abs(float(noisy.mean()) - 1.0) < 0.01
    assert abs(float(noisy.std()) - 1.5 * 2.0 / 4.0) < 0.01


# ---------------------------------------------------------------------------------------------- the accumulator


def _random_layout(num_units, max_records, gen):
    sizes = torch.randint(1, max_records + 1, (num_units,), generator=gen).tolist()
    return [u for u, s in enumerate(sizes) for _ in range(s)]


@pytest.mark.parametrize("max_records, mean", [(1, False), (5, False), (5, True), (40, False)])
def test_accumulator_matches_hand_reference_on_random_layouts(max_records, mean):
    gen = torch.Generator().manual_seed(max_records)
    unit_of_row = _random_layout(60, max_records, gen)
    rows, P, physical, c = len(unit_of_row), 50, 16, 3.0
    per_record = torch.randn(rows, P, generator=gen) * torch.rand(rows, 1, generator=gen) * 2
    groups = [[r for r in range(rows) if unit_of_row[r] == u] for u in range(60)]
    acc = UnitClipAccumulator(P, c, "cpu")
    for _ in range(2):  # the state resets between logical steps
        acc.begin_step()
        for start in range(0, rows, physical):
            ids = torch.tensor(unit_of_row[start : start + physical])
            continues = start + physical < rows and unit_of_row[start + physical] == int(ids[-1])
            weight = torch.tensor([1.0 / len(groups[u]) for u in ids.tolist()]) if mean else None
            acc.add(per_record[start : start + physical].clone(), ids, last_unit_continues=continues, row_weight=weight)
        total, norms = acc.finish()
        assert acc.units == len(norms) == 60
        assert (total - _reference_sum(per_record, groups, c, mean)).abs().max() < 1e-5


def _layout_with_gaps_and_a_long_unit(gen, num_units=50, long_unit=7, long_records=37):
    """Unit ids with gaps (units sampled with no records: empty) and one unit spread over several physical batches."""
    sizes = torch.randint(0, 4, (num_units,), generator=gen)  # 0: an empty unit, its id never appears
    sizes[long_unit] = long_records
    return [u for u, s in enumerate(sizes.tolist()) for _ in range(s)]


@pytest.mark.parametrize("physical, mean", [(8, False), (8, True), (5, False), (32, False)])
def test_grouped_path_matches_brute_force_with_empty_units_and_a_unit_over_several_batches(physical, mean):
    """The grouped path (one packed index per batch) against Σ_u clip_C(v_u) by hand, and each unit's norm."""
    gen = torch.Generator().manual_seed(physical + 100 * mean)
    unit_of_row = _layout_with_gaps_and_a_long_unit(gen)
    units = sorted(set(unit_of_row))
    assert len(units) < 50 and unit_of_row.count(7) > physical  # empty units; unit 7 spans 2 or more batches
    rows, P, c = len(unit_of_row), 40, 2.0
    per_record = torch.randn(rows, P, generator=gen) * torch.rand(rows, 1, generator=gen) * 2
    groups = [[r for r in range(rows) if unit_of_row[r] == u] for u in units]
    acc = UnitClipAccumulator(P, c, "cpu")
    acc.begin_step()
    for start in range(0, rows, physical):
        ids = torch.tensor(unit_of_row[start : start + physical])
        continues = start + physical < rows and unit_of_row[start + physical] == int(ids[-1])
        weight = torch.tensor([1.0 / unit_of_row.count(u) for u in ids.tolist()]) if mean else None
        acc.add(per_record[start : start + physical].clone(), ids, last_unit_continues=continues, row_weight=weight)
    total, norms = acc.finish()
    assert acc.units == len(norms) == len(units)
    assert (total - _reference_sum(per_record, groups, c, mean)).abs().max() < 1e-5
    expected = torch.stack([(per_record[g].sum(0) / (len(g) if mean else 1)).norm() for g in groups])
    assert (norms - expected).abs().max() < 1e-5


class _CrossDevice(TorchDispatchMode):
    """Counts host → device copies (``_to_copy`` from cpu to another device) while active."""

    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.ops.aten._to_copy.default and args[0].device.type == "cpu" and out.device.type != "cpu":
            self.copies += 1
        return out


def test_grouped_path_moves_one_packed_index_and_never_syncs():
    """On the meta device (no data), as on CUDA, a value read on the host (nonzero, a boolean mask, .item()) or a
    host tensor mixed into a device op fails: the grouped path runs there and copies ONE index tensor per batch."""
    P = 6
    acc = UnitClipAccumulator(P, 1.0, "meta")
    acc.begin_step()
    batches = [([0, 0, 1, 3], True), ([3, 3, 3, 3], True), ([3, 4, 4, 6], False), ([7, 8, 9, 9], False)]
    for ids, continues in batches:
        probe = _CrossDevice()
        with probe:
            acc.add(torch.randn(len(ids), P, device="meta"), torch.tensor(ids), last_unit_continues=continues)
        assert probe.copies == 1, (ids, probe.copies)
    assert acc.units == 8  # 0, 1, 3, 4, 6, 7, 8, 9
    total, norms = acc.finish()
    assert total.device.type == "meta" and norms.shape == (8,)


def test_accumulator_refuses_bad_unit_orders():
    acc = UnitClipAccumulator(4, 1.0, "cpu")
    with pytest.raises(ValueError, match="non-decreasing"):
        acc.add(torch.ones(3, 4), torch.tensor([0, 2, 1]))
    acc.begin_step()
    acc.add(torch.ones(2, 4), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="contiguous"):
        acc.add(torch.ones(2, 4), torch.tensor([1, 2]))
    acc.begin_step()
    acc.add(torch.ones(2, 4), torch.tensor([0, 1]), last_unit_continues=True)
    with pytest.raises(ValueError, match="left open"):
        acc.add(torch.ones(2, 4), torch.tensor([2, 3]))
    acc.begin_step()
    acc.add(torch.ones(2, 4), torch.tensor([0, 1]), last_unit_continues=True)
    with pytest.raises(TrainingFailedError, match="still open"):
        acc.finish()
    acc.begin_step()
    total, norms = acc.finish()  # an empty logical step: zero sum, no units
    assert float(total.abs().max()) == 0.0 and len(norms) == 0


class _LargestAllocation(TorchDispatchMode):
    """Records the largest new storage (in fp32 values) that any torch op allocates while active (views excluded)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [a for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)]
        seen = {a.untyped_storage().data_ptr() for a in inputs}
        out = func(*args, **kwargs)
        for t in out if isinstance(out, tuple | list) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                self.largest = max(self.largest, t.untyped_storage().nbytes() // 4)
        return out


@pytest.mark.parametrize("max_records", [1, 5])
def test_accumulator_memory_does_not_scale_with_units_per_step(max_records):
    """Held state is ≤ 2 vectors of P and every temporary ≤ (B/2 + 2)·P, for 8 or 400 units in one step."""
    P, physical = 1000, 32
    largest, held = {}, {}
    for num_units in (8, 400):
        gen = torch.Generator().manual_seed(num_units)
        unit_of_row = _random_layout(num_units, max_records, gen)
        unit_of_row[5:5] = [unit_of_row[4]] * 70  # one unit larger than two physical batches
        acc = UnitClipAccumulator(P, 1.0, "cpu", keep_norms=False)
        acc.begin_step()
        probe = _LargestAllocation()
        for start in range(0, len(unit_of_row), physical):
            ids = torch.tensor(unit_of_row[start : start + physical])
            continues = start + physical < len(unit_of_row) and unit_of_row[start + physical] == int(ids[-1])
            G = torch.randn(len(ids), P, generator=gen)
            with probe:
                acc.add(G, ids, last_unit_continues=continues)
        total, _ = acc.finish()
        assert acc.units == num_units
        largest[num_units] = probe.largest
        held[num_units] = sum(t.numel() for t in acc.state_tensors().values())
    assert held[8] == held[400] <= 2 * P
    assert largest[8] <= (physical // 2 + 2) * P and largest[400] <= (physical // 2 + 2) * P
