"""Issue 42.5: an unknown contract key names the dplora key another tool's name stands for (the table in
docs/contract.md, which is dplora/contract/aliases.py) or the nearest key; every unknown and missing key is named
in one line; a mistyped CLI option names the nearest option."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from conftest import ROW_PRIVACY
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.contract.aliases import ALIASES
from dplora.contract.loader import parse_contract
from dplora.contract.spec import Contract
from dplora.errors import BadInputError

ROOT = Path(__file__).resolve().parents[2]
BASE = {
    "privacy": {
        **ROW_PRIVACY,
    },
    "model": {"path": "m"},
    "data": {"path": "d.csv", "text_column": "t"},
    "training": {"expected_batch_size": 8, "steps": 3},
}


def _error(mutate) -> str:
    raw = copy.deepcopy(BASE)
    mutate(raw)
    with pytest.raises(BadInputError) as info:
        parse_contract(raw)
    return str(info.value)


@pytest.mark.parametrize(
    ("section", "key", "expected"),
    [
        ("training", "learning_rate", "unknown key 'training.learning_rate': dplora calls it training.lr"),
        ("training", "num_train_epochs", "unknown key 'training.num_train_epochs': dplora calls it training.epochs"),
        ("lora", "lora_alpha", "unknown key 'lora.lora_alpha': dplora calls it lora.alpha"),
        ("training", "bf16", "unknown key 'training.bf16': dplora calls it model.dtype"),
        ("model", "torch_dtype", "unknown key 'model.torch_dtype': dplora calls it model.dtype"),
        ("training", "lrr", "unknown key 'training.lrr': did you mean training.lr?"),
        ("training", "expected_batch", "unknown key 'training.expected_batch': did you mean training.expected_batch_"),
        ("training", "max_grad_norm", "unknown key 'training.max_grad_norm': did you mean privacy.max_grad_norm?"),
        ("data", "prompt_col", "unknown key 'data.prompt_col': did you mean data.prompt_column?"),
    ],
)
def test_unknown_keys_name_the_dplora_key(section, key, expected):
    message = _error(lambda raw: raw.setdefault(section, {}).update({key: 1}))
    assert message.startswith(f"contract: {expected}")
    assert "\n" not in message


def test_gradient_accumulation_explains_logical_and_physical_batches():
    message = _error(lambda raw: raw["training"].update(gradient_accumulation_steps=4))
    assert "dplora calls it training.expected_batch_size" in message
    assert "logical batch" in message and "physical_batch_size" in message


def test_a_key_without_a_near_name_points_to_the_reference():
    message = _error(lambda raw: raw["privacy"].update(colour="red"))
    assert message == "contract: unknown key 'privacy.colour'; every key: docs/contract.md"


def test_section_typos_and_top_level_keys():
    section = _error(lambda raw: raw.update(trainig={}))
    assert section == "contract: unknown key 'trainig': did you mean the section training?"
    assert _error(lambda raw: raw.update(learning_rate=1)).startswith(
        "contract: unknown key 'learning_rate': dplora calls it training.lr"
    )


def test_every_missing_key_in_one_line():
    def drop(raw):
        del raw["privacy"]["adjacency"], raw["privacy"]["max_grad_norm"], raw["data"]["path"]

    assert _error(drop) == (
        "contract: missing keys 'privacy.adjacency', 'privacy.max_grad_norm', 'data.path'; every key: docs/contract.md"
    )


def test_unknown_and_missing_keys_together():
    def both(raw):
        del raw["privacy"]["adjacency"]
        raw["training"]["learning_rate"] = 1e-3
        raw["lora"] = {"lora_alpha": 16}

    message = _error(both)
    assert message == (
        "contract: unknown key 'lora.lora_alpha': dplora calls it lora.alpha; unknown key 'training.learning_rate': "
        "dplora calls it training.lr; missing key 'privacy.adjacency'; every key: docs/contract.md"
    )


def test_every_alias_names_a_real_key_and_is_not_one():
    real = {f"{s}.{k}" for s, f in Contract.model_fields.items() for k in f.annotation.model_fields}
    plain = {k.split(".")[1] for k in real}
    for name, (target, _) in ALIASES.items():
        assert target in real, name
        assert name not in plain, f"{name} is a dplora key: it needs no alias"


def test_the_docs_table_is_the_alias_table():
    text = (ROOT / "docs" / "contract.md").read_text(encoding="utf-8")
    section = text.split("## Names from TRL, axolotl and the HF Trainer", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| [^|]+ \| `([a-z_.]+)` \| ([^|]*)\|$", section, flags=re.M)
    assert {name: (key, note.strip()) for name, key, note in rows} == ALIASES
    assert len(rows) == len(ALIASES)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train", "x.yaml", "--overwite"], "No such option: --overwite; did you mean --overwrite?"),
        (["train", "x.yaml", "--signing_key", "k"], "No such option: --signing_key; did you mean --signing-key?"),
        (["verify", "r", "--public_key", "k"], "No such option: --public_key; did you mean --public-key?"),
        (["keygen", "--pub", "x"], "No such option: --pub; did you mean --public?"),
    ],
)
def test_cli_option_typos_name_the_nearest_option(args, expected):
    result = CliRunner().invoke(app, args, standalone_mode=True)
    assert result.exit_code == 2
    assert f"error: {expected} (see 'dplora {args[0]} --help')" in result.output


def test_an_option_with_no_near_name_keeps_the_help_pointer():
    result = CliRunner().invoke(app, ["budget", "x.yaml", "--zzzzzz"])
    assert result.exit_code == 2
    assert "error: No such option: --zzzzzz (see 'dplora budget --help')" in result.output
