"""Issue 26.9: `~` is expanded in every path a user gives (contract paths and CLI path options), and a fake
`.gguf` file's error names the file, not its folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import contract_dict, write_contract
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.contract.loader import parse_contract
from dplora.errors import BadInputError

runner = CliRunner()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh $HOME, and a working folder that is not it (a literal `~` folder would appear there)."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    return home


def test_contract_paths_expand_the_home_folder(home):
    raw = contract_dict(Path("~/model"), Path("~/data.csv"), Path("~/runs/r"), data={"eval_path": "~/held.csv"})
    contract = parse_contract(raw)
    assert contract.model.path == str(home / "model")
    assert contract.data.path == str(home / "data.csv")
    assert contract.data.eval_path == str(home / "held.csv")
    assert contract.training.output_dir == str(home / "runs" / "r")


def test_override_paths_expand_too(home, tmp_path):
    from dplora.contract.loader import load_contract

    cfg = write_contract(tmp_path / "c.yaml", contract_dict(tmp_path, tmp_path / "d.csv", tmp_path / "out"))
    contract = load_contract(cfg, ["training.output_dir=~/elsewhere"])
    assert contract.training.output_dir == str(home / "elsewhere")


def test_cli_path_options_and_arguments_expand_the_home_folder(home):
    made = runner.invoke(app, ["keygen", "~/keys/k.key"])
    assert made.exit_code == 0, made.output
    assert (home / "keys" / "k.key").is_file() and (home / "keys" / "k.pub").is_file()
    assert not (Path.cwd() / "~").exists()
    checked = runner.invoke(app, ["verify", "~/no-run", "--public-key=~/keys/k.pub"])
    assert checked.exit_code == 2
    assert str(home / "no-run") in checked.output and "~" not in checked.output


def test_a_fake_gguf_names_the_file(tmp_path):
    from dplora.contract.spec import ModelSection
    from dplora.engine.model import load_model_and_tokenizer

    fake = tmp_path / "models" / "fake.gguf"
    fake.parent.mkdir()
    fake.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(BadInputError) as err:
        load_model_and_tokenizer(ModelSection(path=str(fake)))
    assert f"cannot load model from {fake}:" in str(err.value)
