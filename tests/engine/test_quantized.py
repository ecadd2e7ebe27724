"""4-bit NF4 bases (``model.quantization: 4bit``, issue 30) against the one-record-at-a-time reference, on CPU.

The model: a tiny random Llama (hidden 16, 2 layers) saved to disk, with a planted outlier: token ``OUTLIER`` has
an embedding 1000 in feature ``HOT``, every other token 0 there, and layer 0's ``input_layernorm`` weight is 40 in
that feature, so the outlier record's q/k/v inputs reach ~160 (LLM.int8's ``llm_int8_threshold`` is 6.0) while
the other records' stay below 6 (asserted). It is loaded by transformers with ``BitsAndBytesConfig`` (NF4, double
quantization, fp32 compute: bf16 compute on CPU would add bf16 rounding to a check of exactness), so its
q/k/v/o/gate/up/down projections are bitsandbytes ``Linear4bit`` and peft wraps them as ``lora.bnb.Linear4bit``.

Tolerance: NF4 de-quantizes weights only, so with fp32 compute each record's forward is an fp32 computation of
its own; batched and one-record matmuls differ only by fp32 summation order (~1e-7 relative at hidden 16).
Row-level checks use 1e-5 relative, the isolation check (one record's gradient with two different batch-mates)
1e-6 absolute on gradients of norm ~1e-1. A path that mixes records differs by O(1) (the outlier's gradient is
orders of magnitude larger).
"""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model  # noqa: E402
from support.lora import ALL_7, PAD, randomize_lora_b
from support.lora import RECORDS as LORA_RECORDS
from support.quantized import OUTLIER, bnb, build_model_dir

from dplora.engine import batch as batching  # noqa: E402
from dplora.engine.fastclip import FlatLoRAGrads  # noqa: E402
from dplora.mechanism.clipping import UnitClipAccumulator  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning",
    "ignore::FutureWarning",
    "ignore::DeprecationWarning",
    "ignore::UserWarning",
)


RECORDS = [*LORA_RECORDS[:4], *LORA_RECORDS[5:7]]  # records 0-3, 5 and 6


OUTLIER_RECORD = ([40, OUTLIER, 41, OUTLIER], [40, OUTLIER, 41, OUTLIER])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory)


def _load_4bit(folder):
    """The saved model in NF4 through transformers (independent of dplora's loader), fp32 compute, on CPU."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    config = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32,
    )
    return AutoModelForCausalLM.from_pretrained(
        str(folder), quantization_config=config, dtype=torch.float32, device_map={"": "cpu"}
    )


def _lora(base, targets=ALL_7, seed=1):
    """peft LoRA (fp32) on the 4-bit base, lora_B ~ N(0, 0.3²) so that lora_A gets gradients too."""
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(targets)), autocast_adapter_dtype=True
    )
    return randomize_lora_b(model, seed)


@pytest.fixture(scope="module")
def pristine(model_dir):
    return _lora(_load_4bit(model_dir))


def _trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def _brute_force(model, records) -> torch.Tensor:
    """(N, P): each record alone (trimmed), stock peft forward, its own autograd gradient, flat."""
    rows = []
    for record in records:
        loss = batching.per_sequence_loss(model, batching.collate([record], PAD))[0]
        grads = torch.autograd.grad(loss, _trainable(model), allow_unused=True)
        rows.append(
            torch.cat(
                [
                    (g if g is not None else torch.zeros_like(p)).flatten()
                    for g, p in zip(grads, _trainable(model), strict=True)
                ]
            )
        )
    return torch.stack(rows)


def _fast(model, flat, records) -> torch.Tensor:
    flat.buffer(len(records))
    batching.per_sequence_loss(model, batching.collate(records, PAD)).sum().backward()
    return flat.gradients().clone()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_4bit_layers_take_the_fast_path_and_match_the_one_record_reference(pristine):
    """Every projection is NF4 Linear4bit; G's rows equal each record's own gradient to 1e-5 relative."""
    from peft.tuners.lora.bnb import Linear4bit as LoraLinear4bit

    model = copy.deepcopy(pristine)
    wrapped = [m for m in model.modules() if isinstance(m, LoraLinear4bit)]
    assert len(wrapped) == 2 * 7
    assert all(isinstance(m.base_layer, bnb.nn.Linear4bit) for m in wrapped)
    assert {m.base_layer.weight.quant_type for m in wrapped} == {"nf4"}
    records = [*RECORDS, OUTLIER_RECORD]
    reference = _brute_force(copy.deepcopy(pristine), records)
    flat = FlatLoRAGrads(model)  # main: UncoveredParameterError (a lora.bnb.Linear4bit is not a lora.Linear)
    assert flat.P == sum(p.numel() for p in _trainable(model))
    G = _fast(model, flat, records)
    assert all(float(reference[i].norm()) > 1e-3 for i in range(len(records)))
    for i in range(len(records)):
        assert _rel(G[i], reference[i]) < 1e-5, i


def test_4bit_unit_level_clipped_sum_matches_reference(pristine):
    """Units of 1-3 records across physical batches of 2: the clipped sum equals Σ_u clip_C(Σ_{i∈u} g_i)."""
    model = copy.deepcopy(pristine)
    records = [*RECORDS, OUTLIER_RECORD]
    reference = _brute_force(copy.deepcopy(pristine), records)
    groups = [[0, 1, 2], [3], [4, 5], [6]]
    c = float(torch.stack([reference[g].sum(0) for g in groups]).norm(dim=1).median())
    flat = FlatLoRAGrads(model)
    acc = UnitClipAccumulator(flat.P, c, "cpu")
    acc.begin_step()
    order = [r for g in groups for r in g]
    unit_of = {r: u for u, g in enumerate(groups) for r in g}
    for start in range(0, len(order), 2):
        chunk = order[start : start + 2]
        nxt = order[start + 2] if start + 2 < len(order) else None
        ids = torch.tensor([unit_of[r] for r in chunk])
        acc.add(
            _fast(model, flat, [records[r] for r in chunk]),
            ids,
            last_unit_continues=nxt is not None and unit_of[nxt] == ids[-1],
        )
    total, norms = acc.finish()
    expected = torch.zeros(flat.P)
    for g in groups:
        v = reference[g].sum(0)
        expected += v * min(1.0, c / (float(v.norm()) + 1e-6))
    assert int((norms > c).sum()) >= 1 and int((norms < c).sum()) >= 1  # some units clipped, some not
    assert _rel(total, expected) < 1e-5


def test_outlier_batch_mate_does_not_change_another_records_gradient(pristine):
    """Record 0's per-example gradient is the same next to the outlier record as next to an ordinary one (1e-6),
    and the outlier really is one: its q_proj input exceeds LLM.int8's threshold 6.0, the others' does not."""
    model = copy.deepcopy(pristine)
    peak = {}

    def hook(module, args):
        peak[module] = torch.stack([a.abs().amax() for a in args[0]])  # per record

    q0 = model.base_model.model.model.layers[0].self_attn.q_proj
    handle = q0.register_forward_pre_hook(hook)
    flat = FlatLoRAGrads(model)
    plain = _fast(model, flat, [RECORDS[0], RECORDS[1]])
    assert float(peak[q0].max()) < 6.0
    outlier = _fast(model, flat, [RECORDS[0], OUTLIER_RECORD])
    assert float(peak[q0][1]) > 100.0 and float(peak[q0][0]) < 6.0
    handle.remove()
    assert float(outlier[1].norm()) > 1e-3 and _rel(outlier[1], plain[1]) > 0.5  # a different batch-mate
    assert float((outlier[0] - plain[0]).abs().max()) <= 1e-6
    alone = _brute_force(copy.deepcopy(pristine), [RECORDS[0]])[0]
    assert _rel(outlier[0], alone) < 1e-5


def test_opacus_per_sample_gradients_on_a_4bit_base_match_the_reference(pristine):
    """``privacy.per_sample: opacus``: Opacus hooks the fp32 lora_A/lora_B Linear submodules of Linear4bit."""
    from opacus import GradSampleModule

    model = copy.deepcopy(pristine)
    records = [RECORDS[0], OUTLIER_RECORD, RECORDS[2]]
    reference = _brute_force(copy.deepcopy(pristine), records)
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum")
    batching.per_sequence_loss(gsm, batching.collate(records, PAD)).sum().backward()
    G = torch.cat([p.grad_sample.reshape(len(records), -1) for p in _trainable(model)], dim=1)
    for i in range(len(records)):
        assert _rel(G[i], reference[i]) < 1e-5, i


def test_loader_stores_nf4_and_records_the_unquantized_digests(model_dir):
    """``load_base_model`` gives NF4 Linear4bit layers computing in the run's dtype; the record entry names the
    quantization and the digests of the unquantized files (those of the same folder without quantization)."""
    from dplora.contract.spec import ModelSection
    from dplora.engine.basefiles import base_model_entry
    from dplora.engine.model import load_base_model

    section = ModelSection(path=str(model_dir), quantization="4bit")
    model, tokenizer = load_base_model(section, torch.device("cpu"), "fp32", False, log=lambda _: None)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 14
    assert {m.compute_dtype for m in layers} == {torch.float32}
    assert {m.weight.quant_type for m in layers} == {"nf4"}
    assert all(m.weight.quant_state.nested for m in layers)  # double quantization
    assert tokenizer.pad_token_id == PAD
    entry = base_model_entry(section, dtype="fp32")
    assert entry["quantization"] == {
        "method": "bitsandbytes",
        "bits": 4,
        "quant_type": "nf4",
        "double_quant": True,
        "compute_dtype": "fp32",
        "bitsandbytes_version": bnb.__version__,
        "source": "base_model.files are the unquantized weights, quantized to NF4 when loaded",
    }
    plain = base_model_entry(ModelSection(path=str(model_dir)))
    assert "quantization" not in plain
    assert entry["files"] == plain["files"] and "model.safetensors" in entry["files"]


@pytest.mark.parametrize("quantization", ["none", "4bit"])
def test_an_already_quantized_folder_is_refused(tmp_path, model_dir, quantization):
    """A folder whose config.json carries LLM.int8's quantization_config (as `save_pretrained` of an 8-bit model
    writes it) would load as 8-bit layers whatever model.quantization says: refused before loading (red team)."""
    import json
    import shutil

    from dplora.contract.spec import ModelSection
    from dplora.engine.model import load_base_model
    from dplora.errors import BadInputError

    folder = tmp_path / "int8"
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_8bit": True, "load_in_4bit": False}
    (folder / "config.json").write_text(json.dumps(config))
    section = ModelSection(path=str(folder), quantization=quantization)
    with pytest.raises(BadInputError, match=r"already quantized \(bitsandbytes 8-bit\)"):
        load_base_model(section, torch.device("cpu"), "fp32", False, log=lambda _: None)


def test_a_4bit_load_with_an_8bit_layer_is_refused(monkeypatch, model_dir):
    """Whatever transformers loaded, a 4-bit run holds only NF4 Linear4bit bitsandbytes layers."""
    from dplora.contract.spec import ModelSection
    from dplora.engine import model as model_mod
    from dplora.engine import quantize
    from dplora.errors import BadInputError

    real = quantize.load_4bit

    def with_int8(folder, device, dtype, attn):
        model = real(folder, device, dtype, attn)
        layer = model.model.layers[0].self_attn.q_proj
        model.model.layers[0].self_attn.q_proj = bnb.nn.Linear8bitLt(layer.in_features, layer.out_features, bias=False)
        return model

    monkeypatch.setattr(quantize, "load_4bit", with_int8)
    section = ModelSection(path=str(model_dir), quantization="4bit")
    with pytest.raises(BadInputError, match="as Linear8bitLt, not NF4 Linear4bit"):
        model_mod.load_base_model(section, torch.device("cpu"), "fp32", False, log=lambda _: None)


def test_8bit_is_refused_with_one_line(tmp_path, tickets_csv, signing_key):
    """``model.quantization: 8bit`` exits 2 with one line that says why, and writes nothing."""
    from conftest import train_tiny

    result, out = train_tiny(tmp_path, tmp_path / "no-model", tickets_csv, signing_key, model={"quantization": "8bit"})
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "8bit" in lines[0] and "outlier" in lines[0] and "whole batch" in lines[0], lines
    assert "Traceback" not in result.output and not out.exists()
