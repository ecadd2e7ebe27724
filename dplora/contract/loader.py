"""Loading a contract: YAML read within bounds (no aliases, tags, non-name or duplicate keys, deep nesting),
command-line overrides (``training.lr=1e-3 privacy.target_epsilon=8``, as in torchtune and LLaMA-Factory) and
validation errors as one line that names the key and the allowed values. The model is :mod:`dplora.contract.spec`.
"""

from __future__ import annotations

import datetime
import math
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dplora.contract.aliases import hint, suggest
from dplora.contract.shape import resolve_auto
from dplora.contract.spec import MAX_CONTRACT_BYTES, MAX_NESTING, Contract
from dplora.errors import BadInputError, UnknownKeysError, excerpt


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


def _dotted_leaves(prefix: str, value: Any) -> list[str]:
    """``prefix.key=value`` for each scalar or list leaf of a mapping (what to write instead of a mapping)."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _dotted_leaves(f"{prefix}.{k}", v)]
    shown = yaml.safe_dump(value, default_flow_style=True, width=10**6).split("\n")[0]
    return [f"{prefix}={shown}"]


def _refuse_mapping(key: str, value: Any) -> None:
    """Refuse a mapping value (or a list holding one): overrides are scalars or lists of scalars."""
    if isinstance(value, dict):
        use = " ".join(_dotted_leaves(key, value)[:4]) or f"{key}.KEY=VALUE"
        raise BadInputError(
            f"override {excerpt(key)}: a mapping value is not allowed (it would replace the whole section); "
            f"give one dotted key per override, e.g. {excerpt(use, 200)}"
        )
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        raise BadInputError(f"override {excerpt(key)}: a list may hold only scalars (no lists or mappings)")


def replace_overrides(user: list[str], pinned: list[str]) -> list[str]:
    """The user's overrides less those whose key ``pinned`` sets, then ``pinned`` (for internal, derived overrides).

    :func:`apply_overrides` refuses a key given twice; a command that derives overrides of its own (an audit's
    pinned keys, a sweep trial's output folder) replaces the user's value of the same key through here.

    Returns:
        ``KEY=VALUE`` strings, each key once when each list has each key once.
    """
    keys = {item.partition("=")[0].strip() for item in pinned}
    return [item for item in user if item.partition("=")[0].strip() not in keys] + list(pinned)


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``section.key=value`` overrides (values parsed as YAML scalars or flow lists) to a raw contract dict.

    An override of one key of a mutually exclusive pair (:data:`EXCLUSIVE`, e.g. ``training.steps`` on a
    contract with ``training.epochs``) removes the other from the file; two overrides of one pair stay an error.
    A value is a scalar or a list of scalars: a mapping (``lora={r: 2}``) would replace the whole section and is
    refused, naming the dotted keys to use (``lora.r=2``). Each key may appear once, as in the file.

    Raises:
        BadInputError: an override without ``=`` or with an empty key, a mapping value, a key given twice.
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
        if tuple(parts) in overridden:
            raise BadInputError(f"override {excerpt(key.strip())} given twice; each key may appear once")
        parsed = _parse_value(key, value)
        _refuse_mapping(key.strip(), parsed)
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {} if child is None else child
                if not isinstance(child, dict):
                    raise BadInputError(f"override {excerpt(key)}: {excerpt(part)} is not a section")
                node[part] = child
            node = child
        node[parts[-1]] = parsed
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
    if isinstance(value, (datetime.date, datetime.time)):  # YAML reads 2026-01-01 as a date: show it as written
        return value.isoformat()
    return excerpt(value)


def _loc_part(part: str | int) -> str:
    if isinstance(part, int):
        return f"[{part}]"
    return "." + (part if len(part) <= 40 and part.isprintable() else excerpt(part, 40))


_UNION_TAG = re.compile(r"<.*>|[a-z]+(-[a-z]+)+(\[.*\])?|[a-z-]+\[.*\]")


def _is_union_tag(part) -> bool:
    """A location part pydantic adds for a union member (``<list>``, ``constrained-int``, ``literal['auto']``),
    never a contract key (keys are identifiers with underscores)."""
    return isinstance(part, str) and _UNION_TAG.fullmatch(part) is not None


def _loc(error: dict) -> str:
    parts = [p for p in error["loc"] if not (error["type"] != "extra_forbidden" and _is_union_tag(p))]
    return "".join(_loc_part(p) for p in parts).lstrip(".") or "contract"


def _unknown(error: dict) -> str:
    """``unknown key 'training.learning_rate': dplora calls it training.lr``: the nearest key or another tool's
    name (:func:`dplora.contract.aliases.suggest`), else a pointer to the reference."""
    loc = _loc(error)
    names = [p for p in error["loc"] if isinstance(p, str)]
    hint = ""
    if len(names) == 2:
        hint = suggest(names[0], names[1], Contract)
    elif len(names) == 1:
        hint = suggest(None, names[0], Contract)
    return f"unknown key {loc!r}" + (f": {hint}" if hint else "")


GROUP_UNKNOWN_FROM = 4  # this many unknown keys or more: another tool's config, answered grouped


def _names(error: dict) -> tuple[str | None, str]:
    """(section or None at the top level, key) of an unknown-key error."""
    names = [p for p in error["loc"] if isinstance(p, str)]
    return (names[0], names[1]) if len(names) == 2 else (None, names[-1])


def _unknown_parts(errors: list[dict]) -> list[str]:
    """Every unknown key in words: one part per key with its hint, or, from :data:`GROUP_UNKNOWN_FROM` keys (a
    config written for another tool), one part that names them all grouped by what dplora has for each: another
    tool's name for a dplora key, the nearest dplora key or section, or none."""
    extra = [e for e in errors if e["type"] == "extra_forbidden"]
    if len(extra) < GROUP_UNKNOWN_FROM:
        return [_unknown(e) for e in extra]
    named, nearest, none = [], [], []
    for e in extra:
        section, key = _names(e)
        found = hint(section, key, Contract)
        loc = _loc(e)
        if found is None:
            none.append(loc)
        elif found[0] == "alias":
            named.append(f"{loc} → {found[1]}" + (f" ({found[2]})" if found[2] else ""))
        else:
            target = f"the section {found[1]}" if found[0] == "section" else found[1]
            nearest.append(f"{loc} → {target}" + (f" ({found[2]})" if found[2] else ""))
    groups = [
        ("dplora calls them", named),
        ("nearest dplora keys", nearest),
        ("no dplora key", none),
    ]
    body = "; ".join(f"{title}: {', '.join(items)}" for title, items in groups if items)
    return [f"{len(extra)} unknown keys (every dplora key: docs/contract.md) — {body}"]


def _format_error(err: ValidationError) -> str:
    """The contract's validation errors in its own terms, on one line: every unknown key (with the nearest key or
    another tool's name for it) and every missing key at once; otherwise the first error: the dotted key, the
    value, what is allowed."""
    errors = err.errors()
    unknown = _unknown_parts(errors)
    missing = [_loc(e) for e in errors if e["type"] == "missing"]
    if unknown or missing:
        parts = list(unknown)
        if len(missing) == 1:
            parts.append(f"missing key {missing[0]!r}")
        elif missing:
            parts.append("missing keys " + ", ".join(repr(m) for m in missing))
        tail = "" if all(":" in u for u in unknown) and not missing else "; every key: docs/contract.md"
        tail = "" if any("docs/contract.md" in u for u in unknown) else tail  # the grouped part names it already
        return "; ".join(parts) + tail
    first = errors[0]
    loc = _loc(first)
    kind, ctx = first["type"], first.get("ctx", {})
    if kind == "value_error":  # our own validators: the message already names the keys
        return str(ctx.get("error", first["msg"].removeprefix("Value error, ")))
    phrase = _PHRASES.get(kind)
    if phrase is not None:
        phrase = phrase.format(**{k: ctx.get(k, "") for k in ("gt", "ge", "lt", "le", "expected", "max_length")})
    else:
        phrase = first["msg"].replace("Input should be", "must be")
    if kind in ("float_type", "int_type", "int_from_float"):  # a number or a word (``auto``): name both
        words = [e["ctx"]["expected"] for e in errors[1:] if e["type"] == "literal_error" and _loc(e) == loc]
        phrase += f", or {words[0]}" if words else ""
    if kind in ("literal_error", "enum", "float_type", "int_type") and isinstance(first.get("input"), bool):
        # YAML 1.1 reads an unquoted yes/no/on/off as a boolean: the user wrote a word, the message shows true/false
        phrase += " (YAML reads an unquoted yes, no, on or off as true or false: quote a word)"
    if "input" in first and not isinstance(first["input"], dict):
        return f"{loc}={_show(first['input'])}: {phrase}"
    return f"{loc}: {phrase}"


# A value the user must declare (``dplora init`` writes it for N, ε and δ): read as a missing key.
DECLARE = "DECLARE"


def _placeholders(raw: dict) -> tuple[dict, list[str]]:
    """``raw`` without its ``DECLARE`` values (one level of sections), and their dotted keys in file order."""
    out, keys = {}, []
    for name, section in raw.items():
        if isinstance(section, dict):
            kept = {}
            for key, value in section.items():
                if isinstance(value, str) and value == DECLARE:
                    keys.append(f"{name}.{key}")
                else:
                    kept[key] = value
            out[name] = kept
        else:
            out[name] = section
    return out, keys


def _missing_line(missing: list[str], declare: list[str], unknown: list[str] = ()) -> str:
    """One line: every unknown key (with its suggestion), every missing key, every key left as DECLARE."""
    parts = list(unknown)
    if missing:
        parts.append(f"missing key{'s' if len(missing) > 1 else ''} {', '.join(repr(m) for m in missing)}")
    if declare:
        parts.append(
            f"declare {', '.join(declare)} (written as {DECLARE}: the comments beside them say why dplora cannot "
            "fill them)"
        )
    tail = "; every key: docs/contract.md" if missing or any(":" not in u for u in unknown) else ""
    tail = "" if any("docs/contract.md" in u for u in unknown) else tail  # the grouped part names it already
    return "contract: " + "; ".join(parts) + tail


def parse_contract(raw: Any) -> Contract:
    """Validate a raw mapping into a :class:`Contract`.

    Every missing key, and every key written as :data:`DECLARE` (a value left for the user, as ``dplora init``
    writes N, ε and δ), is reported at once on one line; otherwise the first offending key.

    Raises:
        BadInputError: one line naming every missing or undeclared key, else the first offending key and what is
            allowed.
    """
    if not isinstance(raw, dict):
        raise BadInputError("the contract must be a YAML mapping with sections privacy, model, data, lora, training")
    raw, declare = _placeholders(raw)
    try:
        contract = Contract.model_validate(raw)
    except ValidationError as err:
        missing = [
            ".".join(str(p) for p in e["loc"] if not _is_union_tag(p)) for e in err.errors() if e["type"] == "missing"
        ]
        missing = [m for m in dict.fromkeys(missing) if m not in declare]
        if missing or declare:
            unknown = _unknown_parts(err.errors())
            error = UnknownKeysError if unknown else BadInputError
            raise error(_missing_line(missing, declare, unknown)) from None
        error = UnknownKeysError if any(e["type"] == "extra_forbidden" for e in err.errors()) else BadInputError
        raise error(f"contract: {_format_error(err)}") from None
    if declare:  # keys that have a default (privacy.num_units) but were left for the user to declare
        raise BadInputError(_missing_line([], declare))
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
        working directory). ``data.record_format: auto`` with no column named is resolved from the data file's
        structure (:func:`dplora.contract.shape.resolve_auto`: TRL prompt/completion, ShareGPT ``conversations``).

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
    return load_contract_bytes(data, overrides, label=str(path))


def load_contract_bytes(data: bytes | str, overrides: list[str] | None = None, *, label: str = "<string>") -> Contract:
    """:func:`load_contract` of a contract's YAML text (``dplora.train("privacy: …")`` from Python): the same bounds,
    parser, overrides and validation; ``label`` names it in errors.

    Raises:
        BadInputError: too large, not UTF-8, bad YAML, unknown key, bad value.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    if len(data) > MAX_CONTRACT_BYTES:
        raise BadInputError(f"contract {label} is larger than {MAX_CONTRACT_BYTES // 1024} KiB: not a contract")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise BadInputError(f"contract {label} is not UTF-8 (line {line}); save it as UTF-8") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadInputError(f"contract {label} is not valid YAML{where}") from None
    if raw is None:
        raw = {}
    if isinstance(raw, dict) and overrides:
        raw = apply_overrides(raw, overrides)

    return resolve_auto(parse_contract(raw))
