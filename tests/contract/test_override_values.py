"""Overrides are scalars or lists (issue 26.5): a mapping value is refused naming the dotted keys to use, and a
key given twice on the command line is an error, as it is in the file. Checked on `dplora validate` (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import contract_dict
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.contract.loader import apply_overrides, load_contract, replace_overrides
from dplora.errors import BadInputError

runner = CliRunner()


@pytest.fixture
def config(tmp_path) -> Path:
    raw = contract_dict(Path("/m"), Path("d.csv"), Path("out"))
    raw["lora"] = {"r": 4, "alpha": 16}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _validate(config, *overrides):
    result = runner.invoke(app, ["validate", str(config), *overrides])
    return result.exit_code, result.output.strip()


def test_a_mapping_value_is_refused_naming_the_dotted_keys(config):
    """`lora={r: 2}` would replace the whole section (alpha back to its default): exit 2, one line, `lora.r=2`."""
    assert load_contract(config).lora.alpha == 16
    code, output = _validate(config, "lora={r: 2}")
    assert code == 2 and len(output.splitlines()) == 1, output
    assert "lora.r=2" in output and "mapping" in output
    code, output = _validate(config, "lora={r: 2, alpha: 8}")
    assert code == 2 and "lora.r=2 lora.alpha=8" in output
    with pytest.raises(BadInputError, match="lora.r=2"):
        apply_overrides({"lora": {"r": 4, "alpha": 16}}, ["lora={r: 2}"])
    with pytest.raises(BadInputError, match="only scalars"):
        apply_overrides({}, ["lora.target_modules=[{a: 1}]"])


def test_scalars_and_lists_still_apply(config):
    c = load_contract(config, ["lora.r=2", "lora.target_modules=[q_proj, k_proj]"])
    assert (c.lora.r, c.lora.alpha, c.lora.target_modules) == (2, 16, ("q_proj", "k_proj"))


def test_a_key_twice_on_the_command_line_is_an_error(config):
    code, output = _validate(config, "lora.r=2", "lora.r=8")
    assert code == 2 and len(output.splitlines()) == 1, output
    assert "lora.r" in output and "twice" in output
    with pytest.raises(BadInputError, match="twice"):
        apply_overrides({}, ["training.lr=1e-3", " training.lr=2e-3"])


def test_derived_overrides_replace_the_users_value_of_the_same_key():
    """A command's own overrides (audit pins, a sweep trial's folder) replace the user's, never duplicate them."""
    merged = replace_overrides(["training.output_dir=a", "lora.r=2"], ["training.output_dir=b"])
    assert merged == ["lora.r=2", "training.output_dir=b"]
    assert apply_overrides({}, merged) == {"lora": {"r": 2}, "training": {"output_dir": "b"}}
