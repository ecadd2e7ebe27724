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

import pytest
from support.quantized import build_model_dir

bnb = pytest.importorskip("bitsandbytes")  # the `quant` extra; CI installs it (scripts/setup.sh)


pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning",
    "ignore::FutureWarning",
    "ignore::DeprecationWarning",
    "ignore::UserWarning",
)


OUTLIER, HOT = 99, 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory)


def test_train_4bit_and_verify(tmp_path, model_dir, tickets_csv, signing_key):
    """A short ``dplora train`` on the 4-bit tiny model trains and ``dplora verify`` passes; the signed record and
    the card name the quantization and the unquantized weights' digests."""
    from conftest import release_statement, train_tiny
    from typer.testing import CliRunner

    from dplora.cli.app import app
    from dplora.engine.basefiles import base_model_files

    result, out = train_tiny(
        tmp_path, model_dir, tickets_csv, signing_key, model={"quantization": "4bit"}, training={"steps": 2}
    )
    assert result.exit_code == 0, result.output
    assert "device: cpu (NF4 4-bit base, fp32 compute, fp32 LoRA)" in result.output  # not "fp32 base" (issue 42.10)
    verified = CliRunner().invoke(app, ["verify", str(out), "--public-key", str(signing_key[1])])
    assert verified.exit_code == 0, verified.output
    base = release_statement(out)["predicate"]["base_model"]
    assert base["quantization"]["quant_type"] == "nf4" and base["quantization"]["compute_dtype"] == "fp32"
    assert base["quantization"]["bitsandbytes_version"] == bnb.__version__
    assert base["files"] == base_model_files(model_dir)
    card = (out / "adapter" / "README.md").read_text()
    assert "`nf4`" in card and "unquantized weights" in card and bnb.__version__ in card
    assert "quantization: 4bit" in (out / "contract.yaml").read_text()
