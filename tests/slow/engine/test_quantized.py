"""The slow tier of tests/engine/test_quantized.py, whose docstring describes the module."""

from __future__ import annotations

import pytest
from support.quantized import bnb, build_model_dir

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning",
    "ignore::FutureWarning",
    "ignore::DeprecationWarning",
    "ignore::UserWarning",
)


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
