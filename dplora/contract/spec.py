"""The privacy contract: a YAML file validated into a frozen :class:`Contract` (pydantic v2).

Every key is closed: unknown keys, unknown enum values, non-finite or non-positive numbers are errors that
name the key and the allowed values. ``load_contract`` also applies command-line overrides
(``training.lr=1e-3 privacy.target_epsilon=8``, as in torchtune and LLaMA-Factory).

The YAML boundary is bounded too: a contract file is at most ``MAX_CONTRACT_BYTES``, nests at most
``MAX_NESTING`` collections deep, and may not use aliases (``*name``: no expansion, so no "billion laughs"),
explicit tags (``!!timestamp``, ``!!set``, ``!!binary``...) or keys that are not plain names. Every number
has a range that the accountant and the engine can use without overflow, and messages quote at most a short
excerpt of any value (:func:`dplora.errors.excerpt`).
"""

from __future__ import annotations

import enum
import hashlib
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from dplora.accounting import Accountant, Adjacency, Sampler
from dplora.accounting.calibration import SIGMA_MAX, SIGMA_MIN
from dplora.errors import BadInputError, excerpt

PACKAGED_MODELS = ("smollm2-135m",)


class ProtectedUnit(str, enum.Enum):
    """What one privacy unit is: a data row, a whole ticket, or a whole customer."""

    ROW = "row"
    TICKET = "ticket"
    USER = "user"


class UnitClipping(str, enum.Enum):
    """How a unit's vector is built from its records' gradients before the clip (Charles et al. 2024)."""

    SUM = "sum"
    MEAN = "mean"


class PerSamplePath(str, enum.Enum):
    """Where per-record gradients come from (same clipping, noise and accounting either way): ``fast`` writes every
    LoRA layer's per-example gradients into one buffer; ``opacus`` uses Opacus hooks, the reference path."""

    FAST = "fast"
    OPACUS = "opacus"


class Optimizer(str, enum.Enum):
    """The torch optimiser that consumes the noised, normalised gradient (post-processing: no privacy effect)."""

    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"


# Strict numbers: YAML `true`, quoted "3" or 2.0 for a count are errors, not silently coerced.
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
MAX_STEPS = 1_000_000
# --- bounds of the YAML boundary and of each number (README "The contract"; tests/test_fuzz_boundary.py) ---
MAX_CONTRACT_BYTES = 64 * 1024  # a contract is a few hundred bytes; a bigger file is not a contract
MAX_NESTING = 6  # collections inside collections (a contract needs 3: contract → section → list)
MAX_TARGET_EPSILON = 1e6  # far beyond any meaningful guarantee; keeps calibration and its messages finite
NOISE_MULTIPLIER_RANGE = (SIGMA_MIN, SIGMA_MAX)  # the range calibration searches; 1e-300 and 1e300 broke RDP
MAX_GRAD_NORM = 1e6  # σ·C stays finite in fp32
MAX_NUM_UNITS = 10**12
MAX_LORA_RANK = 1024
MAX_THREADS = 1024
MAX_NAME_CHARS = 256  # column names, unit keys, module names, population names
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux


def _printable(value: str) -> str:
    if not value.isprintable():
        raise PydanticCustomError("not_printable", "must be printable text on one line (no control characters)")
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("nul_in_path", "must not contain a NUL character")
    return value


NonEmptyStr = Annotated[str, Field(min_length=1, strict=True)]
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS, strict=True), AfterValidator(_printable)]
PathText = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS, strict=True), AfterValidator(_no_nul)]


class Precision(str, enum.Enum):
    """Dtype of the frozen base weights. LoRA parameters, per-example gradients, clipping, noise and the optimiser
    state stay fp32 in every mode. ``auto``: bf16 on a GPU that supports it, fp32 on CPU."""

    AUTO = "auto"
    BF16 = "bf16"
    FP32 = "fp32"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


class PrivacySection(_Section):
    """What is protected and how much: the part of the contract that feeds the accountant."""

    protected_unit: ProtectedUnit
    unit_key: Name | None = None
    adjacency: Adjacency
    target_epsilon: Annotated[float, Field(gt=0, le=MAX_TARGET_EPSILON, allow_inf_nan=False, strict=True)]
    delta: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False, strict=True)]
    accountant: Accountant = Accountant.PRV
    num_units: Annotated[int, Field(gt=0, le=MAX_NUM_UNITS, strict=True)] | None = None
    max_grad_norm: Annotated[float, Field(gt=0, le=MAX_GRAD_NORM, allow_inf_nan=False, strict=True)]
    sampling: Sampler = Sampler.POISSON
    noise_multiplier: (
        Annotated[
            float,
            Field(ge=NOISE_MULTIPLIER_RANGE[0], le=NOISE_MULTIPLIER_RANGE[1], allow_inf_nan=False, strict=True),
        ]
        | None
    ) = None
    max_records_per_unit: PositiveInt | None = None
    unit_clipping: UnitClipping = UnitClipping.SUM
    population: Name | None = None
    per_sample: PerSamplePath = PerSamplePath.FAST
    # false: the non-private control (same data, model, steps, sampling; no clipping, no noise, no DP guarantee)
    enabled: Annotated[bool, Field(strict=True)] = True

    @model_validator(mode="after")
    def _unit_key_matches_unit(self) -> PrivacySection:
        if self.protected_unit is ProtectedUnit.ROW and self.unit_key is not None:
            raise ValueError("privacy.unit_key must be empty when protected_unit is row")
        if self.protected_unit is not ProtectedUnit.ROW and not self.unit_key:
            raise ValueError(
                f"privacy.unit_key is required when protected_unit is {self.protected_unit.value}: "
                "name the column that holds the ticket or customer id"
            )
        return self


class ModelSection(_Section):
    """The base model: a packaged name, a local Hugging Face folder, or a .gguf file."""

    name: Name | None = None
    path: PathText | None = None
    dtype: Precision = Precision.AUTO
    allow_tf32: Annotated[bool, Field(strict=True)] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if (self.name is None) == (self.path is None):
            raise ValueError("model: give exactly one of model.name (packaged model) or model.path (folder or .gguf)")
        if self.name is not None and self.name not in PACKAGED_MODELS:
            raise ValueError(f"model.name={excerpt(self.name)}: allowed values are {', '.join(PACKAGED_MODELS)}")
        return self


class DataSection(_Section):
    """Training data read through ``datasets``: csv, jsonl or parquet; a text column or prompt/response columns."""

    path: PathText
    format: Literal["auto", "csv", "jsonl", "parquet"] = "auto"
    text_column: Name | None = None
    prompt_column: Name | None = None
    response_column: Name | None = None
    # The held-out set (dplora.evaluate.heldout): a separate file, or a split of `path` by protected unit.
    eval_path: PathText | None = None
    eval_fraction: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False, strict=True)] | None = None
    eval_public: Annotated[bool, Field(strict=True)] = False
    label_column: Name | None = None
    group_column: Name | None = None  # public labels only: evaluation reports per group (dplora.evaluate.heldout)

    @model_validator(mode="after")
    def _held_out(self) -> DataSection:
        if self.eval_path is not None and self.eval_fraction is not None:
            raise ValueError("data: give at most one of data.eval_path (a file) or data.eval_fraction (a split)")
        if self.eval_public and self.eval_path is None:
            raise ValueError(
                "data.eval_public=true needs data.eval_path: a split of the training data (data.eval_fraction) "
                "is private data"
            )
        if self.label_column is not None and (self.prompt_column is None or not self.has_eval_set):
            raise ValueError(
                "data.label_column needs data.prompt_column and a held-out set (eval_path or eval_fraction)"
            )
        if self.group_column is not None and not self.has_eval_set:
            raise ValueError("data.group_column needs a held-out set (data.eval_path or data.eval_fraction)")
        return self

    @property
    def has_eval_set(self) -> bool:
        """A held-out set is configured (``eval_path`` or ``eval_fraction``)."""
        return self.eval_path is not None or self.eval_fraction is not None

    @model_validator(mode="after")
    def _columns(self) -> DataSection:
        has_text = self.text_column is not None
        has_pair = self.prompt_column is not None or self.response_column is not None
        if has_text == has_pair:
            raise ValueError("data: give either data.text_column, or both data.prompt_column and data.response_column")
        if has_pair and (self.prompt_column is None or self.response_column is None):
            raise ValueError("data: give both data.prompt_column and data.response_column")
        return self


class LoraSection(_Section):
    """LoRA adapters (Hu et al. 2021) via peft: rank r, alpha, dropout and the target modules."""

    r: Annotated[int, Field(gt=0, le=MAX_LORA_RANK, strict=True)] = 8
    alpha: PositiveFloat = 16.0
    dropout: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False, strict=True)] = 0.0
    target_modules: Annotated[tuple[Name, ...], Field(max_length=MAX_NAME_CHARS)] = ("q_proj", "v_proj")

    @field_validator("target_modules")
    @classmethod
    def _non_empty(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v or any(not m for m in v):
            raise ValueError("lora.target_modules must be a non-empty list of module names")
        return v


class TrainingSection(_Section):
    """Logical/physical batching, length of training, optimiser, and where to write."""

    expected_batch_size: PositiveInt
    physical_batch_size: PositiveInt = 8
    epochs: PositiveFloat | None = None
    steps: Annotated[int, Field(gt=0, le=MAX_STEPS, strict=True)] | None = None
    lr: PositiveFloat = 2e-3
    optimizer: Optimizer = Optimizer.ADAMW
    max_seq_len: Annotated[int, Field(gt=1, le=8192, strict=True)] = 64
    seed: Annotated[int, Field(ge=0, lt=2**63, strict=True)] = 0
    output_dir: PathText = "runs/dplora"
    threads: Annotated[int, Field(gt=0, le=MAX_THREADS, strict=True)] | None = None
    checkpoint_every: PositiveInt | None = None  # logical steps between resume checkpoints (None: ~10 min of work)

    @model_validator(mode="after")
    def _length(self) -> TrainingSection:
        if (self.epochs is None) == (self.steps is None):
            raise ValueError("training: give exactly one of training.epochs or training.steps")
        return self


class Contract(_Section):
    """The whole validated contract. Immutable; :attr:`sha256` is the digest of the resolved YAML."""

    privacy: PrivacySection
    model: ModelSection
    data: DataSection
    lora: LoraSection = LoraSection()
    training: TrainingSection

    def to_yaml(self) -> str:
        """The resolved contract (overrides applied) as YAML with enums as plain strings."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @property
    def sha256(self) -> str:
        """sha256 hex of :meth:`to_yaml`, the contract the run actually used."""
        return hashlib.sha256(self.to_yaml().encode("utf-8")).hexdigest()


class YamlRefusedError(BadInputError):
    """YAML that a contract may not use: an alias, a tag, a non-name key, a duplicate key, nesting too deep, or a
    scalar that cannot be built (an impossible date, an integer of thousands of digits). ``reason`` names it,
    ``line`` is 1-based."""

    def __init__(self, reason: str, line: int):
        super().__init__(f"contract: line {line}: {reason}")
        self.reason, self.line = reason, line


def _line(node_or_event) -> int:
    return node_or_event.start_mark.line + 1


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader for contracts: refuses aliases (no expansion), explicit tags, nesting deeper than
    ``MAX_NESTING``, keys that are not plain names, and duplicate keys (YAML would silently keep the last one)."""

    _depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise YamlRefusedError("a YAML alias (*name) is not allowed; write the value out", _line(event))
        if getattr(event, "tag", None) is not None:
            tag = excerpt(event.tag.replace("tag:yaml.org,2002:", "!!"))
            raise YamlRefusedError(f"the YAML tag {tag} is not allowed; write plain values", _line(event))
        if not isinstance(event, yaml.CollectionStartEvent):
            return super().compose_node(parent, index)
        if self._depth >= MAX_NESTING:
            raise YamlRefusedError(f"values nest more than {MAX_NESTING} levels deep", _line(event))
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as err:
            raise YamlRefusedError(f"a value cannot be read ({err.__class__.__name__})", _line(node)) from None

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlRefusedError(
                    "a key that is a list or a mapping is not allowed; keys are names", _line(key_node)
                )
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                raise YamlRefusedError(f"the key {_show(key)} is not a name; keys are text", _line(key_node))
            if key in seen:
                raise YamlRefusedError(f"duplicate key {excerpt(key)}; each key may appear once", _line(key_node))
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 reads 1e-3 (no dot) as a string; accept it as a float, as users write learning rates and deltas.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
        r"|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _parse_value(key: str, text: str) -> Any:
    """An override's value as a YAML scalar (or flow list), under the contract's YAML rules; text if not YAML.

    Raises:
        BadInputError: an alias, a tag or nesting that a contract may not use.
    """
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError:
        return text
    except YamlRefusedError as err:
        if err.reason.startswith("a value cannot be read"):
            return text
        raise BadInputError(f"override {excerpt(key)}: {err.reason}") from None


# Keys of which the contract holds exactly one (or one group): an override of one replaces the others from the file.
EXCLUSIVE: dict[tuple[str, str], tuple[str, ...]] = {
    ("training", "epochs"): ("steps",),
    ("training", "steps"): ("epochs",),
    ("model", "name"): ("path",),
    ("model", "path"): ("name",),
    ("data", "text_column"): ("prompt_column", "response_column"),
    ("data", "prompt_column"): ("text_column",),
    ("data", "response_column"): ("text_column",),
    ("data", "eval_path"): ("eval_fraction",),
    ("data", "eval_fraction"): ("eval_path",),
}


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``section.key=value`` overrides (values parsed as YAML scalars) to a raw contract dict.

    An override of one key of a mutually exclusive pair (:data:`EXCLUSIVE`, e.g. ``training.steps`` on a
    contract with ``training.epochs``) removes the other from the file; two overrides of one pair stay an error.

    Raises:
        BadInputError: an override without ``=`` or with an empty key.
    """
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    overridden: set[tuple[str, ...]] = set()
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or any(not p for p in key.split(".")):
            raise BadInputError(
                f"override {excerpt(item)}: expected KEY=VALUE with a dotted key, e.g. training.lr=1e-3"
            )
        parts = key.strip().split(".")
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {} if child is None else child
                if not isinstance(child, dict):
                    raise BadInputError(f"override {excerpt(key)}: {excerpt(part)} is not a section")
                node[part] = child
            node = child
        node[parts[-1]] = _parse_value(key, value)
        overridden.add(tuple(parts))
        if node[parts[-1]] is not None:
            for other in EXCLUSIVE.get(tuple(parts), ()):
                if (parts[0], other) not in overridden:
                    node.pop(other, None)
    return out


_SECTION = "must be a section of keys (a YAML mapping)"
_WHOLE = "must be a whole number (no quotes, no decimal point)"
_PHRASES = {
    "model_type": _SECTION,
    "model_attributes_type": _SECTION,
    "dict_type": _SECTION,
    "tuple_type": "must be a list, e.g. [q_proj, v_proj]",
    "list_type": "must be a list, e.g. [q_proj, v_proj]",
    "int_type": _WHOLE,
    "int_from_float": _WHOLE,
    "float_type": "must be a number (no quotes)",
    "string_type": "must be text",
    "bool_type": "must be true or false",
    "string_too_short": "must not be empty",
    "string_too_long": "must be at most {max_length} characters",
    "too_long": "must have at most {max_length} items",
    "finite_number": "must be a finite number",
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be ≥ {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be ≤ {le}",
    "literal_error": "allowed values are {expected}",
    "enum": "allowed values are {expected}",
}


def _show(value: Any) -> str:
    """A contract value as YAML would write it (short; long values are cut, sections never echoed)."""
    if value is None or isinstance(value, bool):
        return yaml.safe_dump(value).split("\n")[0]
    return excerpt(value)


def _loc_part(part: str | int) -> str:
    if isinstance(part, int):
        return f"[{part}]"
    return "." + (part if len(part) <= 40 and part.isprintable() else excerpt(part, 40))


def _format_error(err: ValidationError) -> str:
    """The first validation error in the contract's own terms: the dotted key, the value, what is allowed."""
    first = err.errors()[0]
    loc = "".join(_loc_part(p) for p in first["loc"]).lstrip(".") or "contract"
    kind, ctx = first["type"], first.get("ctx", {})
    if kind == "extra_forbidden":
        return f"unknown key {loc!r}: see the README's contract reference for the allowed keys"
    if kind == "missing":
        return f"missing key {loc!r}"
    if kind == "value_error":  # our own validators: the message already names the keys
        return str(ctx.get("error", first["msg"].removeprefix("Value error, ")))
    phrase = _PHRASES.get(kind)
    if phrase is not None:
        phrase = phrase.format(**{k: ctx.get(k, "") for k in ("gt", "ge", "lt", "le", "expected", "max_length")})
    else:
        phrase = first["msg"].replace("Input should be", "must be")
    if "input" in first and not isinstance(first["input"], dict):
        return f"{loc}={_show(first['input'])}: {phrase}"
    return f"{loc}: {phrase}"


def parse_contract(raw: Any) -> Contract:
    """Validate a raw mapping into a :class:`Contract`.

    Raises:
        BadInputError: one line naming the first offending key and what is allowed.
    """
    if not isinstance(raw, dict):
        raise BadInputError("the contract must be a YAML mapping with sections privacy, model, data, lora, training")
    try:
        contract = Contract.model_validate(raw)
    except ValidationError as err:
        raise BadInputError(f"contract: {_format_error(err)}") from None
    for name in ("target_epsilon", "max_grad_norm", "delta"):
        value = getattr(contract.privacy, name)
        if not math.isfinite(value):  # pragma: no cover - pydantic already rejects inf/nan
            raise BadInputError(f"contract: privacy.{name}={value!r} must be finite")
    return contract


def load_contract(path: str | Path, overrides: list[str] | None = None) -> Contract:
    """Read a YAML contract, apply overrides and validate it.

    Args:
        path: the YAML file.
        overrides: ``KEY=VALUE`` strings with dotted keys.

    Returns:
        The frozen :class:`Contract`. Relative ``data.path`` / ``model.path`` stay as written (relative to the
        working directory).

    Raises:
        BadInputError: missing file, bad YAML, unknown key, bad value.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_CONTRACT_BYTES + 1)
    except FileNotFoundError:
        raise BadInputError(f"contract file not found: {path}") from None
    except OSError as err:
        raise BadInputError(f"cannot read contract {path}: {err.strerror or err.__class__.__name__}") from None
    if len(data) > MAX_CONTRACT_BYTES:
        raise BadInputError(f"contract {path} is larger than {MAX_CONTRACT_BYTES // 1024} KiB: not a contract")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise BadInputError(f"contract {path} is not UTF-8 (line {line}); save it as UTF-8") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadInputError(f"contract {path} is not valid YAML{where}") from None
    if raw is None:
        raw = {}
    if isinstance(raw, dict) and overrides:
        raw = apply_overrides(raw, overrides)
    return parse_contract(raw)
