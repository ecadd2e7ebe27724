"""docs/contract.md against the contract model (issue 25): every key of every section of
:class:`dplora.contract.spec.Contract` has a row in that section's table, no row names a key that does not exist,
and each row's default column agrees with the model (``required``, a literal default, or anything else for an
optional key without one).

The checker is run on the shipped page, and on models and pages built to break it: a section with an extra field,
a row for a removed key, a wrong default. So it is shown to fail when a key is added without documentation.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path

import pytest
from pydantic import BaseModel, create_model
from pydantic_core import PydanticUndefined

from dplora.contract.spec import Contract, PrivacySection

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "contract.md"

_SECTION = re.compile(r"^## `([a-z_]+):`")
_KEY = re.compile(r"`([a-z_][a-z0-9_]*)(?::[^`]*)?`")


def _cells(line: str) -> list[str]:
    """The cells of one markdown table row (escaped ``\\|`` kept inside its cell)."""
    parts = re.split(r"(?<!\\)\|", line.strip())
    return [p.strip() for p in parts[1:-1]]


def documented_keys(text: str) -> dict[str, dict[str, list[str]]]:
    """Rows of the key tables of a contract page: {section: {key: [type, default, meaning]}}.

    A section is a ``## `name:` `` heading; its rows are table rows up to the next heading whose first cell holds
    a backticked key (the header and separator rows have none). Raises ValueError on a key documented twice.
    """
    sections: dict[str, dict[str, list[str]]] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            match = _SECTION.match(line)
            current = match.group(1) if match else None
            if current is not None:
                sections.setdefault(current, {})
            continue
        if current is None or not line.startswith("|"):
            continue
        cells = _cells(line)
        keys = _KEY.findall(cells[0]) if cells else []
        for key in keys:
            if key in sections[current]:
                raise ValueError(f"{current}.{key} is documented twice")
            sections[current][key] = cells[1:]
    return sections


def model_keys(model: type[BaseModel]) -> dict[str, dict[str, object]]:
    """{section: {key: default}} of a contract model; PydanticUndefined marks a required key."""
    out: dict[str, dict[str, object]] = {}
    for name, field in model.model_fields.items():
        section = field.annotation
        out[name] = {key: f.default for key, f in section.model_fields.items()}
    return out


def _literal(default: object) -> str:
    if isinstance(default, enum.Enum):
        default = default.value
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, tuple):
        return "[" + ", ".join(default) + "]"
    return str(default)


def _same(documented: str, default: object) -> bool:
    match = re.match(r"`([^`]*)`", documented)
    if match is None:
        return False
    text, want = match.group(1), _literal(default)
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        try:
            return float(text) == float(want)
        except ValueError:
            return False
    return text == want


def problems(model: type[BaseModel], text: str) -> list[str]:
    """Every mismatch between a contract model and a contract page, one line each (empty: they agree)."""
    found: list[str] = []
    docs = documented_keys(text)
    keys = model_keys(model)
    for section in sorted(keys.keys() | docs.keys()):
        have, said = keys.get(section), docs.get(section)
        if have is None:
            found.append(f"{section}: documented, but the contract has no such section")
            continue
        if said is None:
            found.append(f"{section}: section not documented")
            continue
        for key in sorted(have.keys() - said.keys()):
            found.append(f"{section}.{key}: not documented")
        for key in sorted(said.keys() - have.keys()):
            found.append(f"{section}.{key}: documented, but the contract has no such key")
        for key in sorted(have.keys() & said.keys()):
            row, default = said[key], have[key]
            if len(row) != 3:
                found.append(f"{section}.{key}: row needs type, default and meaning")
                continue
            cell = row[1]
            if default is PydanticUndefined:
                ok = cell == "required"
            elif default is None:
                ok = bool(cell) and cell != "required"
            else:
                ok = _same(cell, default)
            if not ok:
                want = "required" if default is PydanticUndefined else _literal(default)
                found.append(f"{section}.{key}: default documented as {cell!r}, the contract says {want!r}")
    return found


def test_contract_page_documents_every_key_and_no_other():
    text = PAGE.read_text(encoding="utf-8")
    assert problems(Contract, text) == []
    # the parser finds every row (so a parser that finds nothing cannot pass) in the five sections
    counts = {s: len(k) for s, k in documented_keys(text).items()}
    assert counts == {s: len(k) for s, k in model_keys(Contract).items()}
    assert set(counts) == {"privacy", "model", "data", "lora", "training"} and sum(counts.values()) >= 40


def test_a_key_added_without_documentation_is_reported():
    """A privacy section with one more field (as a new contract key would be): the checker names it."""
    privacy = create_model("PrivacyPlus", __base__=PrivacySection, clip_schedule=(str, "fixed"))
    plus = create_model("ContractPlus", __base__=Contract, privacy=(privacy, ...))
    assert problems(plus, PAGE.read_text(encoding="utf-8")) == ["privacy.clip_schedule: not documented"]


def test_a_documented_key_that_does_not_exist_is_reported():
    text = PAGE.read_text(encoding="utf-8")
    row = next(
        line + "\n"
        for line in text.splitlines()
        if line.startswith("| `lr` | float, 0 < lr ≤ 10, or `auto` | `0.002` |")
    )
    assert row in text
    extra = text.replace(row, row + "| `cooldown_steps` | integer | `0` | Not a key. |\n")
    assert problems(Contract, extra) == ["training.cooldown_steps: documented, but the contract has no such key"]
    missing = text.replace(row, "")
    assert problems(Contract, missing) == ["training.lr: not documented"]


@pytest.mark.parametrize(
    ("row", "wrong", "message"),
    [
        (
            "| `r` | integer 1 … 1024 | `8` |",
            "| `r` | integer 1 … 1024 | `16` |",
            "lora.r: default documented as '`16`'",
        ),
        ("| `delta` | float, 0 < δ < 1/N | required |", "| `delta` | float, 0 < δ < 1/N | `1e-5` |", "privacy.delta"),
        ("| `accountant` | `prv` \\| `rdp` \\| `pld` | `prv` |", "| `accountant` | x | `rdp` |", "privacy.accountant"),
    ],
)
def test_a_wrong_default_is_reported(row, wrong, message):
    text = PAGE.read_text(encoding="utf-8")
    assert row in text
    (line,) = problems(Contract, text.replace(row, wrong))
    assert line.startswith(message), line


def test_a_key_documented_twice_is_refused():
    text = PAGE.read_text(encoding="utf-8")
    row = next(
        line + "\n"
        for line in text.splitlines()
        if line.startswith("| `lr` | float, 0 < lr ≤ 10, or `auto` | `0.002` |")
    )
    with pytest.raises(ValueError, match="training.lr is documented twice"):
        documented_keys(text.replace(row, row + row))
