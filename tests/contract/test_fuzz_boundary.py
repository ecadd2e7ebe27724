"""Fuzzed input boundary: generated contracts, overrides and data files through ``validate``/``budget``, and a few
one-step ``train`` runs on the tiny model. Every case must end in exit 0 or 2 with at most one ``error:`` line on
stderr (bounded, never a traceback), and write nothing on exit 2.

Hypothesis runs derandomized (the same cases on every run, so CI cannot flake); the counts by exit code are printed
(``pytest -s``). A deeper local fuzz: ``DPLORA_FUZZ_EXAMPLES=5000 DPLORA_FUZZ_RANDOM=1 pytest -s -k fuzzed``.
Budget runs in-process (CliRunner) with the RDP accountant, a given σ and q = 1, so one case costs milliseconds
unless it reaches the accountant.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest
import typer
import yaml
from click.testing import CliRunner
from conftest import contract_dict, write_contract
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dplora.cli.app import app
from dplora.errors import EXCERPT_CHARS, MAX_MESSAGE_CHARS, excerpt, one_line

CONTRACT_CASES = int(os.environ.get("DPLORA_FUZZ_EXAMPLES", 500))
DATA_CASES = max(60, CONTRACT_CASES // 8)
DERANDOMIZE = not os.environ.get("DPLORA_FUZZ_RANDOM")
LONG = 300  # generated strings at least this long must never appear whole in a message

BASE = {
    "privacy": {
        "protected_unit": "user",
        "unit_key": "user_id",
        "adjacency": "add_remove",
        "target_epsilon": 8.0,
        "delta": 1e-5,
        "accountant": "rdp",
        "max_grad_norm": 1.0,
        "noise_multiplier": 2.0,
    },
    "model": {"path": "/nonexistent/model"},
    "data": {"path": "data.csv", "prompt_column": "message", "response_column": "reply"},
    "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    # q = 9/9 = 1: RDP has a closed form there, so a valid case costs milliseconds, not the accountant's seconds
    "training": {"expected_batch_size": 9, "steps": 5, "lr": 0.01, "output_dir": "out"},
}
KEYS = {section: sorted(values) for section, values in BASE.items()}
KEYS["privacy"] += ["num_units", "max_records_per_unit", "unit_clipping", "population", "sampling", "per_sample"]
KEYS["model"] += ["name", "dtype", "allow_tf32", "attn_implementation"]
KEYS["data"] += ["format", "text_column"]
KEYS["lora"] += ["dropout"]
KEYS["training"] += [
    "epochs",
    "physical_batch_size",
    "optimizer",
    "max_seq_len",
    "seed",
    "threads",
    "gradient_checkpointing",
]
TAGS = ["!!timestamp", "!!bool", "!!set", "!!binary", "!!str", "!!int", "!!float", "!!omap", "!!python/none", "!x"]
ODD_TEXT = ["", " ", "💥🔥", "\u202eevil", "a\nb", "a\x1bb", "null", "NaN", "~", "1e-3", "0x10", "1_000", "2001-13-45"]
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
ODD_NUMBERS = [0, -1, 2**63, 10**30, 1e300, 1e-300, 5e-324, -0.0, 1e-3, 9.99e-4, 1e4, 10000.5, 1e6, 1000000.1, 1e-7]

COMMAND = typer.main.get_command(app)  # built once: typer's CliRunner rebuilds it on every call (about 50 ms)


def invoke(args: list[str]):
    """Run ``dplora ARGS`` in-process, as the console script would (one-line errors, exit codes)."""
    return CliRunner().invoke(COMMAND, [str(a) for a in args])


# --- strategies ------------------------------------------------------------------------------------------------------

scalars = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(ODD_NUMBERS),
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.sampled_from(ODD_TEXT),
    st.integers(min_value=LONG, max_value=3000).map(lambda n: "é" + "x" * n),
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)
sections = st.sampled_from([*KEYS, "evaluation", ""])


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


def _bomb(levels: int) -> str:
    """A "billion laughs": each anchor is a list of nine aliases of the one before (9**levels strings)."""
    lines = ["b0: &b0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


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
        text = _bomb(levels) + value_at.sub(lambda m: m.group(1) + f"*b{levels - 1} #", text, count=1)
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


# --- checks ----------------------------------------------------------------------------------------------------------


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            st_ = path.lstat()
            out[str(path.relative_to(folder))] = (st_.st_size, st_.st_mtime_ns)
    return out


def check_outcome(res, *, as_json: bool, inputs: list[str] = ()) -> int:
    """Exit 0 or 2, no traceback, one bounded error line; with ``--json`` exactly one JSON document on stdout."""
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code in (0, 2), (res.exit_code, res.output[-2000:])
    assert "Traceback" not in res.output
    lines = res.stderr.splitlines()
    if res.exit_code == 2:
        assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr[:2000]
        assert len(lines[0]) <= len("error: ") + MAX_MESSAGE_CHARS
        for value in inputs:  # a long input value is quoted as a short excerpt at most
            assert value not in lines[0], lines[0]
    else:
        assert not any(line.startswith("error") for line in lines), res.stderr[:2000]
    if as_json:
        doc = json.loads(res.stdout)  # exactly one document: any other output breaks the parse
        assert isinstance(doc, dict) and doc["ok"] is (res.exit_code == 0)
        if res.exit_code:
            assert doc["exit_code"] == 2 and doc["error"] == lines[0].removeprefix("error: ")
    elif res.exit_code == 2:
        assert res.stdout == ""
    return res.exit_code


def _long_strings(obj) -> list[str]:
    """Every string of at least LONG characters in the case (contract text pieces and overrides)."""
    if isinstance(obj, bytes):
        return [m.decode() for m in re.findall(b"x{" + str(LONG).encode() + b",}", obj)]
    return [m for item in obj for m in re.findall(f"x{{{LONG},}}|9{{{LONG},}}", item)]


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """The working directory of the fuzzed commands: a contract, a 40-row data file; the ledger would go here."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPLORA_LEDGER", str(tmp_path / "ledger.sqlite3"))
    rows = [f"u{i % 9},question SECRET{i},answer SECRET{i}" for i in range(40)]
    (tmp_path / "data.csv").write_text("user_id,message,reply\n" + "\n".join(rows) + "\n")
    return tmp_path


def test_messages_are_one_bounded_line():
    """one_line escapes every line break and control character (splitlines finds one line); excerpt cuts."""
    nasty = "a\nb\rc\u2028d\x85e\x1b[31mf\u202eg\udcffh\x00i"
    assert one_line(nasty) == "a\\nb\\rc\\u2028d\\x85e\\x1b[31mf\\u202eg\\udcffh\\x00i"
    assert len(one_line(nasty).splitlines()) == 1 and one_line("é ✓ 💥") == "é ✓ 💥"
    assert len(one_line("x" * 5000)) == MAX_MESSAGE_CHARS and one_line("x" * 5000).endswith("...")
    assert excerpt("x" * 5000) == "'" + "x" * (EXCERPT_CHARS - 4) + "..." and excerpt("ab") == "'ab'"
    assert excerpt(nasty, 1000).isprintable()


# --- contracts and overrides -----------------------------------------------------------------------------------------


def test_fuzzed_contracts_and_overrides_exit_0_or_2(workdir):
    """≥ 500 generated contracts/overrides through validate and budget: exit 0 or 2, one bounded line, no writes."""
    counts: Counter = Counter()
    before = _snapshot(workdir)

    @settings(
        max_examples=CONTRACT_CASES,
        deadline=None,
        derandomize=DERANDOMIZE,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=contract_cases())
    def run(case):
        data, extra, as_json = case
        (workdir / "c.yaml").write_bytes(data)
        snap = _snapshot(workdir)
        long = _long_strings(data) + _long_strings(extra)
        code = check_outcome(invoke(["validate", "c.yaml", *extra]), as_json=False, inputs=long)
        counts["validate", code] += 1
        args = ["budget", "c.yaml", "--show-private", *extra, *(["--json"] if as_json else [])]
        code = check_outcome(invoke(args), as_json=as_json, inputs=long)
        counts["budget", code] += 1
        assert _snapshot(workdir) == snap, "validate/budget wrote a file"

    run()
    (workdir / "c.yaml").unlink()
    assert _snapshot(workdir) == before
    print(f"\nfuzzed contracts: {dict(sorted(counts.items()))}")
    assert sum(n for (cmd, _), n in counts.items() if cmd == "validate") >= CONTRACT_CASES
    assert counts["validate", 0] >= 20 and counts["budget", 0] >= 10  # the valid side is reached too


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (_bomb(9) + "privacy: *b8\n", "alias"),
        ("a: &a {x: 1}\nb: *a\n", "alias"),
        ("privacy: {delta: !!timestamp 0.0001}\n", "!!timestamp"),
        ("privacy: {target_epsilon: !!bool 8.0}\n", "!!bool"),
        ("training: {steps: !!set 20}\n", "!!set"),
        ("? [a, b]\n: 1\n", "keys are names"),
        ("privacy: " + "[" * 5000 + "]" * 5000 + "\n", "nest more than 6"),
        ("training: {steps: " + "9" * 6000 + "}\n", "cannot be read"),
        ("privacy: {delta: 2001-13-45}\n", "cannot be read"),
    ],
    ids=["billion-laughs", "alias", "timestamp", "bool-tag", "set-tag", "complex-key", "deep", "huge-int", "bad-date"],
)
def test_yaml_refusals_name_the_reason(workdir, text, needle):
    """The YAML loader refuses aliases, tags, complex keys, deep nesting and unreadable scalars, in one short line."""
    (workdir / "c.yaml").write_text(text)
    res = invoke(["validate", "c.yaml"])
    check_outcome(res, as_json=False)
    assert res.exit_code == 2 and needle in res.stderr and len(res.stderr) < 200, res.stderr


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("privacy.noise_multiplier=1.0e+300", "must be ≤ 10000"),
        ("privacy.noise_multiplier=1.0e-300", "must be ≥ 0.001"),
        ("privacy.target_epsilon=1e300", "must be ≤ 1000000.0"),
        ("privacy.num_units=1000000000000000000000", "must be ≤ 1000000000000"),
        ("training.threads=100000", "must be ≤ 1024"),
        ("lora.r=1000000000", "must be ≤ 1024"),
        ("data.path=" + "a" * 5000 + ".csv", "at most 4096 characters"),
        ("data.path=" + "a" * 300 + ".csv", "File name too long"),
        ('data.path="a\\0b"', "NUL"),
        ('privacy.unit_key="a\\nb"', "printable"),
        ("training.steps=!!set 20", "!!set"),
        ("--foo=1", "No such option"),
    ],
)
def test_bounded_values_exit_2_before_use(workdir, override, needle):
    """Magnitudes the accountant or the engine cannot use are refused at the boundary, naming the bound."""
    (workdir / "c.yaml").write_text(yaml.safe_dump(BASE))
    res = invoke(["budget", "c.yaml", override, "--json"])
    check_outcome(res, as_json=True, inputs=["a" * 300])
    assert res.exit_code == 2 and needle in res.stderr, res.stderr


# --- data files ------------------------------------------------------------------------------------------------------

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

    @settings(
        max_examples=DATA_CASES,
        deadline=None,
        derandomize=DERANDOMIZE,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=data_files())
    def run(case):
        name, data = case
        (workdir / name).write_bytes(data)
        (workdir / "c.yaml").write_text(yaml.safe_dump({**contract, "data": {**BASE["data"], "path": name}}))
        snap = _snapshot(workdir)
        res = invoke(["budget", "c.yaml", "--json"])
        counts[check_outcome(res, as_json=True)] += 1
        assert "SECRET" not in res.stderr
        assert _snapshot(workdir) == snap
        (workdir / name).unlink()

    run()
    print(f"\nfuzzed data files: {dict(sorted(counts.items()))}")
    assert counts[0] >= 3 and counts[2] >= 10


BROKEN_DATA = {
    "latin-1": (b"user_id,message,reply\nu1,caf\xe9 SECRET,ok\n", "not UTF-8"),
    "ragged row": (b"user_id,message,reply\nu1,a SECRET,b,c\n", "4 fields but the header has 3"),
    "missing unit key": (b"message,reply\nSECRET,b\n", "no column 'user_id'"),
    "empty unit id": (b"user_id,message,reply\n,SECRET,b\n", "column 'user_id' has 1 empty cells"),
    "zero bytes": (b"", "no rows"),
    "header only": (b"user_id,message,reply\n", "no rows"),
    "unbalanced quote": (b'user_id,message,reply\nu1,"SECRET,b\nu2,c,d\n', "unbalanced quote"),
    "duplicate column": (b"user_id,message,message\nu1,SECRET,b\n", "appears twice"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_DATA))
def test_broken_data_files(workdir, case):
    """Named broken files: one line with the reason, never the content."""
    data, needle = BROKEN_DATA[case]
    (workdir / "data.csv").write_bytes(data)
    (workdir / "c.yaml").write_text(yaml.safe_dump(BASE))
    res = invoke(["budget", "c.yaml"])
    check_outcome(res, as_json=False)
    assert res.exit_code == 2 and needle in res.stderr and "SECRET" not in res.stderr, res.stderr


# --- one-step train runs on the tiny model ---------------------------------------------------------------------------

TRAIN_CASES = {  # name: (contract sections, extra CLI arguments, data bytes or None, expected exit, stderr needle)
    "valid --json": ({}, ["--json"], None, 0, ""),
    "valid user-level": ({"privacy": {"protected_unit": "user", "unit_key": "customer_id"}}, [], None, 0, ""),
    "control --json": ({"privacy": {"enabled": False}}, ["--json"], None, 0, "NOT DIFFERENTIALLY PRIVATE"),
    "latin-1 data": ({}, [], b"ticket_id,customer_id,message,reply\nt1,c1,caf\xe9,ok\n", 2, "not UTF-8"),
    "ragged csv": ({}, [], b"ticket_id,customer_id,message,reply\nt1,c1,a,b,c\n", 2, "fields"),
    "missing unit key": ({"privacy": {"protected_unit": "user", "unit_key": "nope"}}, [], None, 2, "no column"),
    "zero-byte data": ({}, [], b"", 2, "no rows"),
    "empty reply": ({}, [], b"ticket_id,customer_id,message,reply\nt1,c1,hello,\n", 2, "empty cells"),
    "sigma 1e-300": ({"privacy": {"noise_multiplier": 1e-300}}, [], None, 2, "noise_multiplier"),
    "threads 1e30": ({"training": {"threads": 10**30}}, [], None, 2, "training.threads"),
    "--threads huge": ({}, ["--threads", "100000"], None, 2, "--threads"),
    "rank 1e9": ({"lora": {"r": 10**9}}, [], None, 2, "lora.r"),
    "unknown module, nested out": ({"lora": {"target_modules": ["nope"]}}, [], None, 2, "lora.target_modules"),
    "long output name": ({"training": {"output_dir": "o" * 300}}, [], None, 2, "output_dir"),
    "population, no ledger": ({"privacy": {"population": "tickets"}}, [], None, 2, "no ledger"),
    "missing signing key --json": ({}, ["--signing-key", "nope.key", "--json"], None, 2, "nope.key"),
    "unknown option": ({}, ["--foo=1"], None, 2, "No such option"),
    "delta 1": ({"privacy": {"delta": 1.0}}, [], None, 2, "privacy.delta"),
    "missing model": ({"model": {"path": "/nonexistent/model"}}, [], None, 2, "model not found"),
}


@pytest.fixture(scope="module")
def train_data(tmp_path_factory) -> Path:
    from dplora.data.demo import write_tickets

    path = tmp_path_factory.mktemp("train-data") / "tickets.csv"
    write_tickets(path, num_tickets=30, seed=3)
    return path


@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_one_step_train_cases(case, tmp_path, monkeypatch, tiny_model_dir, train_data, signing_key):
    """At most 20 one-step runs: exit 0 with a verifiable release (and one JSON document), or exit 2 with nothing
    written (no output, partial or lock folder, no parent folders, no ledger)."""
    sections, extra, data, expected, needle = TRAIN_CASES[case]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPLORA_LEDGER", str(tmp_path / "ledger.sqlite3"))
    data_path = train_data
    if data is not None:
        data_path = tmp_path / "data.csv"
        data_path.write_bytes(data)
    out = "nested/deeper/out" if "nested" in case else "out"
    sections = {k: dict(v) for k, v in sections.items()}
    sections["training"] = {"steps": 1, "expected_batch_size": 4, **sections.get("training", {})}
    sections["privacy"] = {"noise_multiplier": 1.0, **sections.get("privacy", {})}  # σ given: no calibration time
    raw = contract_dict(tiny_model_dir, data_path, out, **sections)
    write_contract(tmp_path / "c.yaml", raw)
    before = _snapshot(tmp_path)
    args = ["train", "c.yaml", "--signing-key", str(signing_key[0]), "--no-progress", *extra]
    res = invoke(args)
    check_outcome(res, as_json="--json" in extra)
    assert res.exit_code == expected, res.output[-2000:]
    assert needle in res.stderr, res.stderr
    if expected == 2:
        assert _snapshot(tmp_path) == before, "train wrote something on exit 2"
        return
    folder = tmp_path / raw["training"]["output_dir"]
    assert (folder / "release.dsse.json").is_file()
    if case == "control --json":  # a non-private control: verify --json is intact but exits 6, in one document
        assert json.loads(res.stdout)["differentially_private"] is False
        check = invoke(["verify", str(folder), "--public-key", str(signing_key[1]), "--json"])
        report = json.loads(check.stdout)
        assert check.exit_code == 6 and report["ok"] is False and report["exit_code"] == 6
        assert report["differentially_private"] is False and "NOT DIFFERENTIALLY PRIVATE" in report["error"]
        assert [c["check"] for c in report["checks"]][:3] == ["key", "signature", "artifacts"]
    elif "--json" in extra:
        doc = json.loads(res.stdout)
        assert doc["steps_done"] == doc["steps"] == 1 and 0 < doc["epsilon_spent"] <= doc["target_epsilon"]
        assert doc["num_units"] == 30 and doc["sample_rate"] == pytest.approx(4 / 30)
        assert doc["delta"] == 1e-5 and doc["accountant"] == "rdp" and len(doc["run_id"]) == 32
        assert doc["paths"]["release"] == str(folder / "release.dsse.json")
        assert not {"seconds", "seconds_per_step", "eval_seconds", "empty_steps"} & set(doc)  # private (issue 40)
        check = invoke(["verify", str(folder), "--public-key", str(signing_key[1]), "--json"])
        assert check.exit_code == 0, check.output
        report = json.loads(check.stdout)
        assert report["ok"] is True and [c["check"] for c in report["checks"]][:3] == ["key", "signature", "artifacts"]
        assert report["claims"]["run_id"] == doc["run_id"]
        assert report["claims"]["epsilon_spent"] == pytest.approx(doc["epsilon_spent"])
        (folder / "adapter" / "adapter_config.json").write_text("{}")  # tamper: exit 3, still one JSON document
        bad = invoke(["verify", str(folder), "--public-key", str(signing_key[1]), "--json"])
        assert bad.exit_code == 3 and len(bad.stderr.splitlines()) == 1
        assert json.loads(bad.stdout) == {"ok": False, "exit_code": 3, "error": bad.stderr.strip()[len("error: ") :]}


# --- command-line overrides with mappings and repeated keys (issue 26.5) --------------------------------------------

mappings = st.dictionaries(st.sampled_from(["r", "alpha", "lr", "x", "target_epsilon", "é"]), scalars, min_size=1)
mapping_keys = st.sampled_from(["lora", "privacy", "training", "data", "lora.r", "training.lr", "privacy.delta"])


def _flow(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("\n...\n").strip("\n")


def test_fuzzed_mapping_and_repeated_overrides_exit_2_with_one_line(workdir):
    """A mapping value (`lora={r: 2}`, a nested one, in a list) or a key given twice on the command line: always
    exit 2 with one bounded `error:` line and no traceback, on validate and budget (--json: one error document)."""
    (workdir / "c.yaml").write_text(yaml.safe_dump(BASE))
    before = _snapshot(workdir)

    @settings(
        max_examples=60, deadline=None, derandomize=DERANDOMIZE, database=None, suppress_health_check=list(HealthCheck)
    )
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
    assert _snapshot(workdir) == before


# --- generate's numbers (issue 26.4) ---------------------------------------------------------------------------------

GENERATE_NUMBERS = [
    ("--max-new-tokens", "0"),
    ("--max-new-tokens", "-1"),
    ("--max-new-tokens", "4097"),
    ("--max-new-tokens", str(10**12)),
    ("--max-new-tokens", "1.5"),
    ("--max-new-tokens", "ten"),
    ("--max-new-tokens", "nan"),
    ("--max-new-tokens", ""),
    ("--temperature", "-0.5"),
    ("--temperature", "nan"),
    ("--temperature", "inf"),
    ("--temperature", "-inf"),
    ("--temperature", "hot"),
    ("--top-p", "-0.1"),
    ("--top-p", "0"),
    ("--top-p", "1.5"),
    ("--top-p", "nan"),
    ("--top-p", "inf"),
    ("--top-p", "-inf"),
    ("--seed", "1.5"),
    ("--seed", str(10**40)),
    ("--threads", "0"),
]


@pytest.mark.parametrize(("option", "value"), GENERATE_NUMBERS)
@pytest.mark.parametrize("as_json", [False, True])
def test_generate_numbers_exit_2_with_one_line(workdir, option, value, as_json):
    """Out-of-range or non-numeric `generate` numbers: exit 2, one `error:` line naming the option, before any run
    folder or model is read (the folder here does not exist), also as `--option=value`."""
    for given_as in ([option, value], [f"{option}={value}"]):
        args = ["generate", "no-run", "--prompt", "hi", "--no-verify", *given_as, *(["--json"] if as_json else [])]
        res = invoke(args)
        check_outcome(res, as_json=as_json)
        assert res.exit_code == 2 and option in res.stderr and "no-run" not in res.stderr, (args, res.stderr)
