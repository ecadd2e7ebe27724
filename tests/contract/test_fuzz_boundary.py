"""Fuzzed input boundary: generated contracts, overrides and data files through ``validate``/``budget``, and a few
one-step ``train`` runs on the tiny model. Every case must end in exit 0 or 2 with at most one ``error:`` line on
stderr (bounded, never a traceback), and write nothing on exit 2.

Hypothesis runs derandomized (the same cases on every run, so CI cannot flake); the counts by exit code are printed
(``pytest -s``). A deeper local fuzz: ``DPLORA_FUZZ_EXAMPLES=5000 DPLORA_FUZZ_RANDOM=1 pytest -s -k fuzzed``.
Budget runs in-process (CliRunner) with the RDP accountant, a given σ and q = 1, so one case costs milliseconds
unless it reaches the accountant.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.fuzz_boundary import (
    BASE,
    SLOW_TRAIN_CASES,
    TRAIN_CASES,
    bomb,
    build_workdir,
    check_outcome,
    invoke,
    run_train_case,
)

from dplora.errors import EXCERPT_CHARS, MAX_MESSAGE_CHARS, excerpt, one_line


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    return build_workdir(tmp_path, monkeypatch)


def test_messages_are_one_bounded_line():
    """one_line escapes every line break and control character (splitlines finds one line); excerpt cuts."""
    nasty = "a\nb\rc\u2028d\x85e\x1b[31mf\u202eg\udcffh\x00i"
    assert one_line(nasty) == "a\\nb\\rc\\u2028d\\x85e\\x1b[31mf\\u202eg\\udcffh\\x00i"
    assert len(one_line(nasty).splitlines()) == 1 and one_line("é ✓ 💥") == "é ✓ 💥"
    assert len(one_line("x" * 5000)) == MAX_MESSAGE_CHARS and one_line("x" * 5000).endswith("...")
    assert excerpt("x" * 5000) == "'" + "x" * (EXCERPT_CHARS - 4) + "..." and excerpt("ab") == "'ab'"
    assert excerpt(nasty, 1000).isprintable()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (bomb(9) + "privacy: *b8\n", "alias"),
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


@pytest.fixture(scope="module")
def train_data(tmp_path_factory) -> Path:
    from dplora.data.demo import write_tickets

    path = tmp_path_factory.mktemp("train-data") / "tickets.csv"
    write_tickets(path, num_tickets=30, seed=3)
    return path


@pytest.mark.parametrize("case", [case for case in TRAIN_CASES if case not in SLOW_TRAIN_CASES])
def test_one_step_train_cases(case, tmp_path, monkeypatch, tiny_model_dir, train_data, signing_key):
    """One-step runs that must exit 2 with nothing written (no output, partial or lock folder, no parent folders, no
    ledger); the runs that train and release are the slow tier's."""
    run_train_case(case, tmp_path, monkeypatch, tiny_model_dir, train_data, signing_key)


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
