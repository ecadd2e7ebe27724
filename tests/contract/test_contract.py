"""Contract validation: closed keys and values, one-line errors naming the key, overrides, shipped configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import contract_dict
from support.contract import shared_raw

from dplora.contract.choices import ProtectedUnit
from dplora.contract.loader import apply_overrides, load_contract, parse_contract
from dplora.contract.spec import Contract
from dplora.errors import BadInputError

ROOT = Path(__file__).resolve().parents[2]


def test_valid_contract_parses_to_enums():
    """A valid contract gives typed, frozen sections."""
    c = parse_contract(shared_raw())
    assert isinstance(c, Contract)
    assert c.privacy.protected_unit is ProtectedUnit.ROW
    assert c.privacy.accountant.value == "rdp"
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="frozen"):
        c.privacy.delta = 0.1


@pytest.mark.parametrize(
    ("section", "key", "value", "needle"),
    [
        ("privacy", "colour", "red", "unknown key 'privacy.colour'"),
        ("privacy", "protected_unit", "family", "privacy.protected_unit"),
        ("privacy", "adjacency", "swap", "add_remove"),
        ("privacy", "accountant", "gdp", "'prv', 'rdp' or 'pld'"),
        ("privacy", "target_epsilon", -1, "privacy.target_epsilon"),
        ("privacy", "target_epsilon", 0, "privacy.target_epsilon"),
        ("privacy", "target_epsilon", float("inf"), "privacy.target_epsilon"),
        ("privacy", "target_epsilon", float("nan"), "privacy.target_epsilon"),
        ("privacy", "max_grad_norm", float("inf"), "privacy.max_grad_norm"),
        ("privacy", "max_grad_norm", 0, "privacy.max_grad_norm"),
        ("privacy", "delta", 1.0, "privacy.delta"),
        ("privacy", "delta", 0, "privacy.delta"),
        ("privacy", "sampling", "shuffle", "poisson"),
        ("training", "expected_batch_size", 0, "training.expected_batch_size"),
        ("training", "lr", -0.1, "training.lr"),
        ("lora", "r", 0, "lora.r"),
    ],
)
def test_bad_values_name_the_key(section, key, value, needle):
    """Each bad value gives one line naming the key (and the allowed values for enums)."""
    raw = shared_raw()
    raw[section][key] = value
    with pytest.raises(BadInputError) as info:
        parse_contract(raw)
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


def test_unit_key_rules():
    """ticket/user need unit_key; row refuses one."""
    raw = shared_raw()
    raw["privacy"]["protected_unit"] = "user"
    with pytest.raises(BadInputError, match="unit_key is required"):
        parse_contract(raw)
    raw["privacy"]["unit_key"] = "customer_id"
    assert parse_contract(raw).privacy.unit_key == "customer_id"
    raw["privacy"]["protected_unit"] = "row"
    with pytest.raises(BadInputError, match="unit_key must be empty"):
        parse_contract(raw)


def test_exactly_one_of_epochs_or_steps():
    raw = shared_raw()
    raw["training"]["epochs"] = 2
    with pytest.raises(BadInputError, match="exactly one of training.epochs or training.steps"):
        parse_contract(raw)


def test_overrides_apply_and_parse_yaml_scalars(tmp_path):
    """Dotted overrides change values and parse numbers; a bad override is a one-line error."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(shared_raw()))
    c = load_contract(path, ["training.lr=1e-3", "privacy.target_epsilon=3", "privacy.num_units=500"])
    assert c.training.lr == pytest.approx(1e-3)
    assert c.privacy.target_epsilon == 3.0
    assert c.privacy.num_units == 500
    with pytest.raises(BadInputError, match="KEY=VALUE"):
        load_contract(path, ["training.lr"])
    with pytest.raises(BadInputError, match="unknown key 'training.learning_rate'"):
        load_contract(path, ["training.learning_rate=1"])
    assert apply_overrides({"a": {"b": 1}}, ["a.c=x"]) == {"a": {"b": 1, "c": "x"}}


def test_missing_and_bad_yaml_files(tmp_path):
    with pytest.raises(BadInputError, match="not found"):
        load_contract(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("privacy: [unclosed\n")
    with pytest.raises(BadInputError, match="not valid YAML"):
        load_contract(bad)


def test_contract_digest_changes_with_content():
    """sha256 covers the resolved contract: one changed value changes it."""
    a = parse_contract(shared_raw())
    raw = shared_raw()
    raw["training"]["lr"] = 0.5
    assert a.sha256 != parse_contract(raw).sha256
    assert a.sha256 == parse_contract(shared_raw()).sha256


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_contract_validates(path):
    """Every example contract in configs/ is valid and uses δ ≤ 1e-5."""
    c = load_contract(path)
    assert c.privacy.delta <= 1e-5


def test_duplicate_keys_are_refused(tmp_path):
    """A reviewer reads the first value; YAML would keep the last: duplicates are an error naming the line."""
    path = tmp_path / "dup.yaml"
    text = yaml.safe_dump(shared_raw()).replace("target_epsilon: 8.0", "target_epsilon: 1.0\n  target_epsilon: 50.0")
    path.write_text(text)
    with pytest.raises(BadInputError, match="duplicate key 'target_epsilon'"):
        load_contract(path)


@pytest.mark.parametrize(
    "override",
    [
        "training.steps=true",
        "training.steps='3'",
        "training.expected_batch_size=2.0",
        "privacy.target_epsilon='3'",
        "privacy.population=''",
        "training.output_dir=''",
        "training.steps=100000000",
        "training.seed=-1",
    ],
)
def test_no_silent_coercion(tmp_path, override):
    """Booleans, quoted numbers, floats for counts, empty names and absurd step counts are errors."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(shared_raw()))
    with pytest.raises(BadInputError):
        load_contract(path, [override])


def test_scientific_notation_without_dot_is_a_number(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(shared_raw()).replace("lr: 0.01", "lr: 1e-3"))
    assert load_contract(path).training.lr == pytest.approx(1e-3)


LIBRARY_WORDING = ("Input should be", "instance of", "Value error", "valid tuple", "Section", "dictionary")


@pytest.mark.parametrize(
    ("section", "value", "expected"),
    [
        ("lora", {"target_modules": "q_proj"}, "lora.target_modules='q_proj': must be a list, e.g. [q_proj, v_proj]"),
        ("training", 5, "training=5: must be a section of keys (a YAML mapping)"),
        ("training", None, "training=null: must be a section of keys (a YAML mapping)"),
        ("model", {"name": "smollm2-135m", "path": "/m"}, "model: give exactly one of model.name"),
        ("training", {"expected_batch_size": 8, "steps": 3.0}, "training.steps=3.0: must be a whole number"),
        ("training", {"expected_batch_size": 8, "steps": True}, "training.steps=true: must be a whole number"),
        ("training", {"expected_batch_size": 8, "steps": 3, "lr": "fast"}, "training.lr='fast': must be a number"),
        ("training", {"expected_batch_size": -1, "steps": 3}, "training.expected_batch_size=-1: must be > 0"),
        ("lora", {"dropout": 1.5}, "lora.dropout=1.5: must be < 1"),
        ("lora", {"target_modules": [1]}, "lora.target_modules[0]=1: must be text"),
        ("data", {"path": "", "text_column": "t"}, "data.path='': must not be empty"),
        ("privacy", [1, 2], "privacy=[1, 2]: must be a section of keys"),
    ],
)
def test_messages_use_the_contracts_terms(section, value, expected):
    raw = shared_raw()
    raw[section] = value
    with pytest.raises(BadInputError) as info:
        parse_contract(raw)
    message = str(info.value)
    assert message.startswith("contract: ") and expected in message, message
    assert not any(w in message for w in LIBRARY_WORDING), message


def test_validator_messages_lose_the_value_error_prefix():
    raw = shared_raw()
    raw["privacy"]["unit_key"] = "customer_id"
    with pytest.raises(BadInputError) as info:
        parse_contract(raw)
    assert str(info.value) == "contract: privacy.unit_key must be empty when protected_unit is row"


def _file_with(tmp_path, **sections) -> Path:
    raw = shared_raw()
    for name, values in sections.items():
        raw[name] = values
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_steps_override_replaces_epochs_from_the_file(tmp_path):
    """bitext.yaml has epochs: training.steps=5 on the command line means 5 steps, not 'give exactly one of'."""
    path = _file_with(tmp_path, training={"expected_batch_size": 8, "epochs": 2.0})
    c = load_contract(path, ["training.steps=5"])
    assert c.training.steps == 5 and c.training.epochs is None
    c = load_contract(_file_with(tmp_path, training={"expected_batch_size": 8, "steps": 7}), ["training.epochs=1.5"])
    assert c.training.epochs == 1.5 and c.training.steps is None
    with pytest.raises(BadInputError, match="give exactly one of training.epochs or training.steps"):
        load_contract(path, ["training.steps=5", "training.epochs=1"])  # both on the command line: still an error


def test_model_and_column_overrides_replace_their_pair(tmp_path):
    path = _file_with(tmp_path)  # model.path and prompt/response columns
    c = load_contract(path, ["model.name=smollm2-135m"])
    assert c.model.name == "smollm2-135m" and c.model.path is None
    c = load_contract(path, ["data.text_column=body"])
    assert c.data.text_column == "body" and c.data.prompt_column is None and c.data.response_column is None
    text = _file_with(tmp_path, data={"path": "d.csv", "text_column": "body"})
    c = load_contract(text, ["data.prompt_column=q", "data.response_column=a"])
    assert (c.data.text_column, c.data.prompt_column, c.data.response_column) == (None, "q", "a")
    with pytest.raises(BadInputError, match="give both data.prompt_column and data.response_column"):
        load_contract(text, ["data.prompt_column=q"])


def test_sharding_fsdp_refusals_and_the_default_yaml(tmp_path):
    """training.sharding: fsdp needs the fast path, a fixed physical batch and an unquantized base (one line each);
    the default (none) leaves the contract's YAML and digest as before the key existed; fsdp is in the YAML."""
    import yaml

    from dplora.contract.loader import parse_contract
    from dplora.errors import BadInputError

    raw = contract_dict(Path("/m"), tmp_path / "tickets.csv", tmp_path / "out", privacy={"num_units": 10})
    plain = parse_contract(raw)
    assert plain.training.sharding.value == "none" and "  sharding:" not in plain.to_yaml()
    fsdp = parse_contract({**raw, "training": {**raw["training"], "sharding": "fsdp"}})
    assert "sharding: fsdp" in fsdp.to_yaml() and fsdp.sha256 != plain.sha256
    assert parse_contract(yaml.safe_load(fsdp.to_yaml())) == fsdp
    cases = {
        "privacy.per_sample=fast": {"privacy": {**raw["privacy"], "per_sample": "opacus"}},
        "physical_batch_size": {"training": {**raw["training"], "physical_batch_size": "auto"}},
        "FSDP-QLoRA": {"model": {**raw["model"], "quantization": "4bit"}},
    }
    for words, change in cases.items():
        bad = {**raw, **change}
        bad["training"] = {**bad["training"], "sharding": "fsdp"}
        with pytest.raises(BadInputError) as err:
            parse_contract(bad)
        assert words in str(err.value) and "\n" not in str(err.value)


def _validate(tmp_path, raw) -> list[str]:
    """The exit code and the non-blank output lines of ``dplora validate`` on ``raw``."""
    from typer.testing import CliRunner

    from dplora.cli.app import app

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["validate", str(path)])
    return [result.exit_code, *(line for line in result.output.splitlines() if line.strip())]


def test_training_lr_is_at_most_10_like_the_warm_start_lr(tmp_path):
    """A rate such as 1e39 used to pass and fail inside the first optimizer step; now one line, exit 2."""
    raw = shared_raw()
    raw["training"]["lr"] = 1e39
    assert _validate(tmp_path, raw) == [2, "error: contract: training.lr=1e+39: must be ≤ 10.0"]
    raw["training"]["lr"] = 10.5
    assert _validate(tmp_path, raw) == [2, "error: contract: training.lr=10.5: must be ≤ 10.0"]
    raw["training"]["lr"] = 10.0
    assert parse_contract(raw).training.lr == 10.0


def test_a_planner_reference_lr_keeps_the_scaled_rate_within_the_bound(tmp_path):
    """With expected_batch_size: auto the lr is the rate at B = 32, scaled by sqrt(B/32) up to the planner's top B:
    a reference rate that would resolve above 10 is refused in one line here, not as an unexpected error when the
    planner's contract is validated."""
    import math

    from dplora.contract.spec import MAX_LR, MAX_REFERENCE_LR, PLANNER_TOP_BATCH
    from dplora.plan.planner import BATCH_GRID, scaled_lr

    assert BATCH_GRID[-1] == PLANNER_TOP_BATCH == 8192 and MAX_REFERENCE_LR == 0.625
    assert scaled_lr(MAX_REFERENCE_LR, PLANNER_TOP_BATCH) == MAX_LR
    raw = shared_raw()
    raw["privacy"]["num_units"] = 10**6
    raw["training"] = {"expected_batch_size": "auto", "lr": 9.0, "output_dir": "out"}
    assert _validate(tmp_path, raw) == [
        2,
        "error: contract: training.lr=9: with expected_batch_size: auto it is the rate at B = 32, which the planner "
        "scales by sqrt(B/32) up to B = 8192: at most 0.625, so the rate run is ≤ 10",
    ]
    raw["training"]["lr"] = 0.6250000001  # just over the bound: shown as given, never rounded onto it
    assert _validate(tmp_path, raw)[1].startswith("error: contract: training.lr=0.6250000001: with")
    raw["training"]["lr"] = 0.625
    assert parse_contract(raw).training.lr == 0.625
    assert math.isclose(scaled_lr(0.625, 8192), 10.0)


@pytest.mark.parametrize(
    ("data", "privacy", "key"),
    [
        ({"group_column": "message"}, {}, "data.prompt_column"),
        ({"group_column": "reply"}, {}, "data.response_column"),
        ({"group_column": "body", "prompt_column": None, "response_column": None, "text_column": "body"}, {}, None),
        ({"group_column": "messages", "prompt_column": None, "response_column": None}, {}, "data.messages_column"),
        (
            {"group_column": "done", "prompt_column": None, "response_column": None, "completion_column": "done"},
            {},
            "data.completion_column",
        ),
        ({"group_column": "customer_id"}, {"protected_unit": "user", "unit_key": "customer_id"}, "privacy.unit_key"),
    ],
)
def test_a_group_column_that_is_training_text_or_the_unit_key_is_refused(tmp_path, data, privacy, key):
    """Group names are printed; a trained column (free private text) or the unit key (names a protected unit) is
    refused from the contract alone, with no data file read (the contract's data.path does not exist)."""
    raw = shared_raw()
    raw["data"] = {k: v for k, v in {**raw["data"], "eval_fraction": 0.1, **data}.items() if v is not None}
    raw["privacy"].update(privacy)
    key = key or "data.text_column"
    group = data["group_column"]
    said = (
        f"error: contract: data.group_column='{group}' is privacy.unit_key: group names are printed, and a unit key "
        "names a protected unit; the group column must hold public labels"
        if key == "privacy.unit_key"
        else f"error: contract: data.group_column='{group}' is {key}, training text: group names are printed, so the "
        "group column must hold public labels (a published schema's categories)"
    )
    assert _validate(tmp_path, raw) == [2, said]
    raw["data"]["group_column"] = "category"
    assert parse_contract(raw).data.group_column == "category"
