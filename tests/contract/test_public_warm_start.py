"""``data.public_warm_start`` (issue 43) at the boundary: what the contract accepts and refuses, each refusal one
line with exit 2, found before the private data is read; the default contract's YAML and digest unchanged.

A refusal may look at paths and at the PUBLIC file's header or schema, never at the private file (the exit code
must not depend on private data): the file checks run before ``data.path`` is loaded, which the tests spy on.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import contract_dict, write_contract
from pydantic_core import PydanticUndefined
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.contract.loader import parse_contract
from dplora.contract.spec import DEFAULT_WARM_START_BATCH, DEFAULT_WARM_START_LR, PublicWarmStart
from dplora.data import units as data_mod
from dplora.data.demo import write_tickets
from dplora.errors import BadInputError

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def _raw(tmp_path: Path, warm, **data) -> dict:
    return contract_dict(
        Path("/m"), tmp_path / "tickets.csv", tmp_path / "out", data={"public_warm_start": warm, **data}
    )


def test_defaults_and_the_yaml_of_a_contract_without_it(tmp_path):
    contract = parse_contract(_raw(tmp_path, {"path": "public.csv", "steps": 100}))
    warm = contract.data.public_warm_start
    assert (warm.path, warm.steps, warm.batch_size, warm.lr) == ("public.csv", 100, 8, 1e-3)
    assert (DEFAULT_WARM_START_BATCH, DEFAULT_WARM_START_LR) == (8, 1e-3)
    assert "public_warm_start:" in contract.to_yaml()
    assert parse_contract(yaml.safe_load(contract.to_yaml())) == contract  # round trip (the released contract.yaml)
    plain = parse_contract(contract_dict(Path("/m"), tmp_path / "tickets.csv", tmp_path / "out"))
    assert plain.data.public_warm_start is None
    # absent: the YAML (so the digest a resume compares and the record states) is the one before the key existed
    assert "public_warm_start" not in plain.to_yaml()
    dumped = plain.model_dump(mode="json")
    dumped["data"].pop("public_warm_start")
    dumped["training"].pop("sharding")  # training.sharding: none is left out the same way
    dumped["training"].pop("max_epochs")  # no epoch cap: left out the same way
    # the default generation task's keys are left out
    for key in ("task", "labels", "labels_file", "calibration_input", "calibration"):
        dumped["data"].pop(key)
    assert plain.to_yaml() == yaml.safe_dump(dumped, sort_keys=False)
    explicit_none = parse_contract(_raw(tmp_path, None))
    assert explicit_none.sha256 == plain.sha256


@pytest.mark.parametrize(
    ("warm", "needle"),
    [
        ({"path": "p.csv"}, "data.public_warm_start.steps"),  # steps has no default
        ({"steps": 5}, "data.public_warm_start.path"),
        ({"path": "p.csv", "steps": 0}, "data.public_warm_start.steps=0: must be > 0"),
        ({"path": "p.csv", "steps": -3}, "data.public_warm_start.steps"),
        ({"path": "p.csv", "steps": "5"}, "data.public_warm_start.steps"),
        ({"path": "p.csv", "steps": 1.5}, "data.public_warm_start.steps"),
        ({"path": "p.csv", "steps": 5, "batch_size": 0}, "data.public_warm_start.batch_size"),
        ({"path": "p.csv", "steps": 5, "lr": 0}, "data.public_warm_start.lr"),
        ({"path": "p.csv", "steps": 5, "lr": -1e-3}, "data.public_warm_start.lr"),
        ({"path": "p.csv", "steps": 5, "lr": float("inf")}, "data.public_warm_start.lr"),
        ({"path": "", "steps": 5}, "data.public_warm_start.path"),
        ({"path": "p.csv", "steps": 5, "epochs": 2}, "unknown key 'data.public_warm_start.epochs'"),
        ("p.csv", "data.public_warm_start"),
    ],
)
def test_bad_values_are_one_line_exit_2(tmp_path, warm, needle):
    raw = _raw(tmp_path, warm)
    with pytest.raises(BadInputError) as info:
        parse_contract(raw)
    assert needle in str(info.value) and "\n" not in str(info.value)
    cfg = write_contract(tmp_path / "c.yaml", raw)
    result = runner.invoke(app, ["validate", str(cfg)])
    assert result.exit_code == 2, result.output
    assert [ln for ln in result.output.splitlines() if ln.strip()] == [f"error: {info.value}"]


@pytest.fixture()
def files(tmp_path, tiny_model_dir):
    """A private training file, a held-out file and a public file with the same columns, under tmp_path."""
    private, held, public = tmp_path / "tickets.csv", tmp_path / "held.csv", tmp_path / "public.csv"
    write_tickets(private, num_tickets=40, seed=1)
    write_tickets(held, num_tickets=10, seed=2)
    write_tickets(public, num_tickets=20, seed=3)
    return tmp_path, private, held, public


def _contract_file(tmp_path, tiny_model_dir, private, public, **data) -> Path:
    raw = contract_dict(
        tiny_model_dir, private, tmp_path / "out", data={"public_warm_start": {"path": str(public), "steps": 2}, **data}
    )
    return write_contract(tmp_path / "c.yaml", raw)


def _refusals(tmp_path: Path, private: Path, held: Path) -> dict[str, tuple[Path, dict, str]]:
    """name: (public path, extra data keys, the expected start of the error's detail)."""
    (tmp_path / "folder.csv").mkdir()
    (tmp_path / "other.csv").write_text("question,answer\nq,a\n")
    (tmp_path / "notes.txt").write_text("message,reply\nq,a\n")
    (tmp_path / "link.csv").symlink_to(private)
    (tmp_path / "sub").mkdir()
    return {
        "missing": (tmp_path / "absent.csv", {}, "public warm-start file not found: data.public_warm_start.path="),
        "a folder": (tmp_path / "folder.csv", {}, "is a folder"),
        "the private file": (private, {}, "is the contract's data.path"),
        "the private file by another path": (
            tmp_path / "sub" / ".." / "tickets.csv",
            {},
            "is the contract's data.path",
        ),
        "the private file through a link": (tmp_path / "link.csv", {}, "is the contract's data.path"),
        "the held-out file": (held, {"eval_path": str(held)}, "is the contract's data.eval_path"),
        "the public held-out file": (held, {"eval_path": str(held), "eval_public": True}, "is the contract's data"),
        "no such columns": (tmp_path / "other.csv", {}, "has no column 'message'"),
        "an unknown type": (tmp_path / "notes.txt", {}, "unknown file type"),
    }


def test_file_refusals_are_one_line_exit_2_before_the_private_data_is_read(
    files, tiny_model_dir, signing_key, monkeypatch
):
    """Each refusal through ``validate --check-files`` and through ``train``: exit 2, one line naming
    data.public_warm_start.path, nothing written, and ``train`` never loaded the private data."""
    tmp_path, private, held, _ = files
    loads: list[str] = []
    real = data_mod.load_split

    def spy(data, **kw):
        loads.append(data.path)
        return real(data, **kw)

    monkeypatch.setattr(data_mod, "load_split", spy)
    for name, (public, extra, detail) in _refusals(tmp_path, private, held).items():
        cfg = _contract_file(tmp_path, tiny_model_dir, private, public, **extra)
        checked = runner.invoke(app, ["validate", str(cfg), "--check-files"])
        trained = runner.invoke(app, ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"])
        for result in (checked, trained):
            assert result.exit_code == 2, (name, result.output)
            lines = [ln for ln in result.output.splitlines() if ln.strip()]
            assert len(lines) == 1 and lines[0].startswith("error: "), (name, result.output)
            assert "data.public_warm_start.path" in lines[0] and detail in lines[0], (name, lines[0])
        assert loads == [], name  # refused before data.path was read
        assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists(), name


def test_a_public_file_and_a_non_private_control_are_accepted(files, tiny_model_dir):
    """A separate public file with the columns passes (also for a non-private control: a control may warm start);
    jsonl conversations are checked by their first record's shape as data.path is."""
    tmp_path, private, _, public = files
    for enabled in (True, False):
        raw = contract_dict(
            tiny_model_dir,
            private,
            tmp_path / "out",
            privacy={"enabled": enabled},
            data={"public_warm_start": {"path": str(public), "steps": 2}},
        )
        result = runner.invoke(app, ["validate", str(write_contract(tmp_path / "c.yaml", raw)), "--check-files"])
        assert result.exit_code == 0, result.output
        assert f"OK  data.public_warm_start.path: {public} (csv; columns message, reply present" in result.output


def test_the_contract_page_documents_every_warm_start_key():
    """docs/contract.md's ``data.public_warm_start`` table: one row per field, with the model's default."""
    text = (ROOT / "docs" / "contract.md").read_text(encoding="utf-8")
    block = text.split("### `data.public_warm_start:`", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in block.splitlines():
        match = re.match(r"\| `([a-z_]+)` \|[^|]*\| ([^|]*) \|", line)
        if match:
            rows[match.group(1)] = match.group(2).strip()
    fields = PublicWarmStart.model_fields
    assert set(rows) == set(fields)
    for key, field in fields.items():
        want = "required" if field.default is PydanticUndefined else f"`{field.default:g}`"
        assert rows[key] == want, key
    assert "| `public_warm_start` |" in text.split("### `data.public_warm_start:`", 1)[0]
