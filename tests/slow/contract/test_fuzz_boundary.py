"""The slow tier of tests/contract/test_fuzz_boundary.py, whose docstring describes the module."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fuzz_boundary import (
    BASE,
    KEYS,
    LONG,
    SLOW_TRAIN_CASES,
    bomb,
    build_workdir,
    check_outcome,
    invoke,
    run_train_case,
    scalars,
    sections,
    snapshot,
    values,
)

CONTRACT_CASES = int(os.environ.get("DPLORA_FUZZ_EXAMPLES", 500))


DATA_CASES = max(60, CONTRACT_CASES // 8)


DERANDOMIZE = not os.environ.get("DPLORA_FUZZ_RANDOM")


def fuzz_settings(max_examples: int):
    """Hypothesis settings of every fuzzed test here: derandomized unless DPLORA_FUZZ_RANDOM, no database."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=DERANDOMIZE,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


TAGS = ["!!timestamp", "!!bool", "!!set", "!!binary", "!!str", "!!int", "!!float", "!!omap", "!!python/none", "!x"]


BENIGN_OVERRIDES = [
    "training.steps=3",
    "training.epochs=2",
    "privacy.target_epsilon=4",
    "privacy.noise_multiplier=3.5",
    "privacy.num_units=100",
    "privacy.max_records_per_unit=2",
    "privacy.unit_clipping=mean",
    "lora.target_modules=[q_proj]",
    "data.text_column=message",
    "training.seed=7",
]


@st.composite
def dict_mutation(draw, raw: dict) -> None:
    """Change one thing in the contract dict: a value, a missing key, an unknown key, a whole section."""
    kind = draw(st.sampled_from(["set", "set", "set", "delete", "section", "unknown"]))
    section = draw(sections)
    if kind == "section":
        raw[section] = draw(values)
        return
    if not isinstance(raw.get(section), dict):
        raw[section] = {}
    if kind == "delete":
        keys = list(raw[section])
        if keys:
            raw[section].pop(draw(st.sampled_from(keys)))
        return
    key = draw(st.text(max_size=8)) if kind == "unknown" else draw(st.sampled_from(KEYS.get(section, ["x"])))
    raw[section][key] = draw(values)


@st.composite
def text_mutation(draw, text: str) -> bytes:
    """Change the YAML text: tags, aliases, complex keys, deep nesting, huge integers, non-UTF-8 bytes, size."""
    kind = draw(
        st.sampled_from(
            ["tag", "bomb", "alias", "complex_key", "deep", "huge_int", "bytes", "duplicate", "control", "cut", "size"]
        )
    )
    key = draw(st.sampled_from([k for keys in KEYS.values() for k in keys if re.search(rf"\b{k}: ", text)] or ["x"]))
    value_at = re.compile(rf"(\b{re.escape(key)}: )")
    if kind == "tag":
        text = value_at.sub(lambda m: m.group(1) + draw(st.sampled_from(TAGS)) + " ", text, count=1)
    elif kind == "bomb":
        levels = draw(st.integers(min_value=2, max_value=9))
        text = bomb(levels) + value_at.sub(lambda m: m.group(1) + f"*b{levels - 1} #", text, count=1)
    elif kind == "alias":
        text = "anchor: &a {x: 1}\n" + text + "extra: *a\n"
    elif kind == "complex_key":
        text += draw(st.sampled_from(["? [a, b]\n: 1\n", "? {a: 1}\n: 2\n", "[1, 2]: x\n", "1: x\n", "null: y\n"]))
    elif kind == "deep":
        depth = draw(st.integers(min_value=5, max_value=3000))
        text = value_at.sub(lambda m: m.group(1) + "[" * depth + "]" * depth + " #", text, count=1)
    elif kind == "huge_int":
        digits = draw(st.integers(min_value=19, max_value=6000))
        text = value_at.sub(lambda m: m.group(1) + "9" * digits + " #", text, count=1)
    elif kind == "duplicate":
        text += draw(st.sampled_from(["privacy: {}\n", "training:\n  steps: 3\n"]))
    elif kind == "control":
        at = draw(st.integers(min_value=0, max_value=len(text)))
        text = text[:at] + draw(st.sampled_from(["\x00", "\x1b[31m", "\x07", "\ufeff", "\t"])) + text[at:]
    elif kind == "cut":
        text = text[: draw(st.integers(min_value=0, max_value=len(text)))]
    elif kind == "size":
        text += "# " + "x" * (70 * 1024) + "\n"
    data = text.encode("utf-8")
    if kind == "bytes":
        at = draw(st.integers(min_value=0, max_value=len(data)))
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xe9", b"\x80\x80", b"\xed\xa0\x80"]))
        data = data[:at] + bad + data[at:]
    return data


def _override_value(draw) -> str:
    raw = draw(
        st.one_of(
            values.map(lambda v: yaml.safe_dump(v, default_flow_style=True, width=10**6).removesuffix("\n...\n")),
            st.sampled_from(["!!set 20", "!!timestamp 0.0001", "*a", "&a [1, *a]", "[" * 50 + "]" * 50, "9" * 5000]),
            st.text(max_size=20),
        )
    )
    return raw.strip("\n")


@st.composite
def overrides(draw) -> list[str]:
    items = []
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2, 3]))):
        kind = draw(st.sampled_from(["key", "key", "benign", "malformed"]))
        if kind == "benign":
            items.append(draw(st.sampled_from(BENIGN_OVERRIDES)))
            continue
        if kind == "malformed":
            items.append(
                draw(st.sampled_from(["noequals", "=1", ".a=1", "a..b=1", "privacy=1", "lora.r.x=2", "--foo=1", "-x"]))
            )
            continue
        section = draw(sections)
        key = draw(st.sampled_from(KEYS.get(section, ["x"])))
        items.append(f"{section}.{key}={_override_value(draw)}")
    return items


@st.composite
def contract_cases(draw) -> tuple[bytes, list[str], bool]:
    """(contract file bytes, overrides, --json) around a valid user-level contract."""
    raw = json.loads(json.dumps(BASE))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2, 3]))):
        draw(dict_mutation(raw))
    text = yaml.safe_dump(raw, allow_unicode=draw(st.booleans()), default_flow_style=draw(st.booleans()))
    mutate = draw(st.sampled_from([False, False, False, True]))  # hypothesis favours the first element
    data = draw(text_mutation(text)) if mutate else text.encode("utf-8")
    return data, draw(overrides()), draw(st.booleans())


def _long_strings(obj) -> list[str]:
    """Every string of at least LONG characters in the case (contract text pieces and overrides)."""
    if isinstance(obj, bytes):
        return [m.decode() for m in re.findall(b"x{" + str(LONG).encode() + b",}", obj)]
    return [m for item in obj for m in re.findall(f"x{{{LONG},}}|9{{{LONG},}}", item)]


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    return build_workdir(tmp_path, monkeypatch)


def test_fuzzed_contracts_and_overrides_exit_0_or_2(workdir):
    """≥ 500 generated contracts/overrides through validate and budget: exit 0 or 2, one bounded line, no writes."""
    counts: Counter = Counter()
    before = snapshot(workdir)

    @fuzz_settings(CONTRACT_CASES)
    @given(case=contract_cases())
    def run(case):
        data, extra, as_json = case
        (workdir / "c.yaml").write_bytes(data)
        snap = snapshot(workdir)
        long = _long_strings(data) + _long_strings(extra)
        code = check_outcome(invoke(["validate", "c.yaml", *extra]), as_json=False, inputs=long)
        counts["validate", code] += 1
        args = ["budget", "c.yaml", "--show-private", *extra, *(["--json"] if as_json else [])]
        code = check_outcome(invoke(args), as_json=as_json, inputs=long)
        counts["budget", code] += 1
        assert snapshot(workdir) == snap, "validate/budget wrote a file"

    run()
    (workdir / "c.yaml").unlink()
    assert snapshot(workdir) == before
    print(f"\nfuzzed contracts: {dict(sorted(counts.items()))}")
    assert sum(n for (cmd, _), n in counts.items() if cmd == "validate") >= CONTRACT_CASES
    assert counts["validate", 0] >= 20 and counts["budget", 0] >= 10  # the valid side is reached too


plain_chars = st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters=',"')


plain_cells = st.text(plain_chars, min_size=1, max_size=5)


odd_cells = st.sampled_from(["", " ", '"', 'a"b', "a,b", '"a,b"', "a\nb", '"a\nb"', "SECRET", "NaN", "null", "💥"])


cells = st.one_of(plain_cells, plain_cells, plain_cells, odd_cells)


GOOD_HEADER = ["user_id", "message", "reply"]


@st.composite
def data_files(draw) -> tuple[str, bytes]:
    """(file name, content): csv or jsonl, ragged rows, quotes, empty cells and ids, missing columns, bad bytes."""
    fmt = draw(st.sampled_from(["csv", "csv", "jsonl"]))
    header = draw(st.sampled_from([GOOD_HEADER] * 4 + [["message", "reply"], ["user_id", "message"], ["a", "a"]]))
    rows = []
    for _ in range(draw(st.sampled_from([3, 1, 6, 0]))):
        width = len(header) + draw(st.sampled_from([0] * 9 + [-1, 1]))
        rows.append(draw(st.lists(cells, min_size=width, max_size=width)))
    if fmt == "csv":
        text = "\n".join([",".join(header), *(",".join(r) for r in rows)]) + draw(st.sampled_from(["", "\n", "\n\n"]))
    else:
        lines = [json.dumps(dict(zip(header, r, strict=False))) for r in rows]
        text = "\n".join(lines + draw(st.sampled_from([[]] * 3 + [["[1, 2]"], ["{bad"], ['{"user_id": 3}']])))
    data = text.encode("utf-8")
    if draw(st.sampled_from([False] * 6 + [True])):
        at = draw(st.integers(min_value=0, max_value=len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xe9", b"\x00", b"\xef\xbb\xbf"])) + data[at:]
    return f"d.{fmt}", data


def test_fuzzed_data_files_exit_0_or_2(workdir):
    """Generated data files through budget: exit 0 or 2, one line naming no cell content, nothing written."""
    counts: Counter = Counter()
    # N = 1000 declared (the data is still read and checked in full) and q = 1: no accountant time per case
    contract = {
        **BASE,
        "privacy": {**BASE["privacy"], "num_units": 1000},
        "training": {**BASE["training"], "expected_batch_size": 1000},
    }

    @fuzz_settings(DATA_CASES)
    @given(case=data_files())
    def run(case):
        name, data = case
        (workdir / name).write_bytes(data)
        (workdir / "c.yaml").write_text(yaml.safe_dump({**contract, "data": {**BASE["data"], "path": name}}))
        snap = snapshot(workdir)
        res = invoke(["budget", "c.yaml", "--json"])
        counts[check_outcome(res, as_json=True)] += 1
        assert "SECRET" not in res.stderr
        assert snapshot(workdir) == snap
        (workdir / name).unlink()

    run()
    print(f"\nfuzzed data files: {dict(sorted(counts.items()))}")
    assert counts[0] >= 3 and counts[2] >= 10


mappings = st.dictionaries(st.sampled_from(["r", "alpha", "lr", "x", "target_epsilon", "é"]), scalars, min_size=1)


mapping_keys = st.sampled_from(["lora", "privacy", "training", "data", "lora.r", "training.lr", "privacy.delta"])


def _flow(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("\n...\n").strip("\n")


def test_fuzzed_mapping_and_repeated_overrides_exit_2_with_one_line(workdir):
    """A mapping value (`lora={r: 2}`, a nested one, in a list) or a key given twice on the command line: always
    exit 2 with one bounded `error:` line and no traceback, on validate and budget (--json: one error document)."""
    (workdir / "c.yaml").write_text(yaml.safe_dump(BASE))
    before = snapshot(workdir)

    @fuzz_settings(60)
    @given(
        key=mapping_keys,
        value=mappings,
        repeated=st.sampled_from(BENIGN_OVERRIDES),
        kind=st.sampled_from(["mapping", "nested", "repeat", "repeat-same"]),
        as_json=st.booleans(),
    )
    def run(key, value, repeated, kind, as_json):
        if kind == "mapping":
            extra = [f"{key}={_flow(value)}"]
        elif kind == "nested":
            extra = [f"{key}={_flow([value])}" if key.count(".") else f"{key}={_flow({'r': value})}"]
        else:
            name, _, given_value = repeated.partition("=")
            extra = [repeated, f"{name}={given_value if kind == 'repeat-same' else _flow(value)}"]
        long = _long_strings(extra)
        for command in ("validate", "budget"):
            args = [command, "c.yaml", *extra, *(["--json"] if as_json and command == "budget" else [])]
            res = invoke(args)
            assert res.exit_code == 2, (args, res.output[-500:])
            check_outcome(res, as_json=as_json and command == "budget", inputs=long)

    run()
    assert snapshot(workdir) == before


@pytest.fixture(scope="module")
def train_data(tmp_path_factory) -> Path:
    from dplora.data.demo import write_tickets

    path = tmp_path_factory.mktemp("train-data") / "tickets.csv"
    write_tickets(path, num_tickets=30, seed=3)
    return path


@pytest.mark.parametrize("case", SLOW_TRAIN_CASES)
def test_one_step_train_cases(case, tmp_path, monkeypatch, tiny_model_dir, train_data, signing_key):
    """One-step runs that exit 0 with a verifiable release (and one JSON document)."""
    run_train_case(case, tmp_path, monkeypatch, tiny_model_dir, train_data, signing_key)
