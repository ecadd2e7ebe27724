"""Attacks on the public warm start (``data.public_warm_start``) and the paths it shares with
``training.optimizer: dp_adambc`` and ``lora.freeze_a`` (FFA-LoRA).

Each ``test_finding_*`` holds the fix in :func:`dplora.data.readers.read_table`: the file name was handed to
``datasets.load_dataset(data_files=...)``, which treats it as an fsspec glob/URL pattern, so a public warm-start
file named ``[t]ickets.csv``, ``ticket?.csv``, ``tick*.csv``, ``file:tickets.csv`` (relative) or
``tickets.csv::/…/pub.csv`` passed the precheck (it IS a separate public file) while the reader loaded the private
``tickets.csv`` instead of it or beside it: noise-free training on private records, charged nothing, and the
record's ``public_warm_start.records`` became a private count next to the sha256 of the file that was NOT read.

Each ``test_held_*`` is an attack the code withstood, kept as a regression. References are independent of the code
under test: the private file carries a canary string in every record, spies sit on the readers, the noise source,
the accountant and the optimizer, and the expected Φ is recomputed from the signed record.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import contract_dict, train_tiny
from support.warm_start_attacks import CANARY, PUBLIC_TICKETS, WARM, decoded_texts, glob_public, write_private

from dplora.contract.loader import parse_contract
from dplora.data import readers
from dplora.data.precheck import check_warm_start_file
from dplora.data.public import public_data
from dplora.engine import warmstart
from dplora.errors import BadInputError

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


def _data(tmp_path: Path, private: Path, public: Path | str, **extra):
    raw = contract_dict(
        Path("/m"), private, tmp_path / "out", data={"public_warm_start": {"path": str(public), **WARM}, **extra}
    )
    return parse_contract(raw).data


GLOB_NAMES = {
    "brackets": "[t]ickets.csv",  # matches tickets.csv only: the private file INSTEAD of the public one
    "question mark": "ticket?.csv",  # matches itself and tickets.csv: both read
    "star": "tick*.csv",  # matches itself and tickets.csv: both read
    "protocol prefix": "file:tickets.csv",  # relative: fsspec reads it as file:// + tickets.csv
    "url chain": "tickets.csv::/pub/public.csv",  # fsspec's chained URL: reads the outer tickets.csv
}


@pytest.mark.parametrize("name", list(GLOB_NAMES.values()), ids=list(GLOB_NAMES))
def test_finding_a_public_file_named_like_a_pattern_reads_the_private_file(tmp_path, monkeypatch, name):
    """The precheck accepts the public file (a different file from data.path: right), then the warm start must read
    THAT file and only it: every example public, as many as the public file's records, its sha256 recorded."""
    from tiny import byte_tokenizer

    monkeypatch.chdir(tmp_path)  # the protocol-prefix case is a relative path, as a contract may give it
    private = write_private(tmp_path / "tickets.csv")
    public = glob_public(tmp_path, name)
    given = name if name.startswith("file:") else public
    data = _data(tmp_path, private, given)
    assert check_warm_start_file(data).startswith("OK  data.public_warm_start.path: ")
    loaded = warmstart.load_public_examples(public_data(data), byte_tokenizer(), max_seq_len=256)
    texts = decoded_texts(loaded.examples)
    assert not any(CANARY in t for t in texts), f"the warm start read the private file through {name!r}"
    assert len(loaded.examples) == PUBLIC_TICKETS
    assert loaded.sha256 == hashlib.sha256(public.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", ["[t]ickets.csv", "tick*.csv"], ids=["brackets", "star"])
def test_finding_any_data_file_is_read_as_named_not_as_a_pattern(tmp_path, name):
    """The same reader serves data.path and data.eval_path (eval_public: its evaluation is published): a file is
    read as named, so a digest, a precheck and a hash always describe the bytes that were trained or evaluated on."""
    write_private(tmp_path / "tickets.csv")
    named = glob_public(tmp_path, name)
    table = readers.read_table(named, "csv")
    assert table.num_rows == PUBLIC_TICKETS and not any(CANARY in m for m in table["message"])


def test_held_every_alias_of_the_private_or_held_out_file_is_refused(tmp_path, monkeypatch):
    """Hard link, /proc/self/root, /proc/self/fd/N, relative against absolute, ``//`` and ``./``, a linked folder,
    data.path itself a link to the 'public' file, a hard link of eval_path: one line, naming the key."""
    monkeypatch.chdir(tmp_path)
    private = write_private(tmp_path / "tickets.csv")
    held = write_private(tmp_path / "held.csv", rows=5)
    os.link(private, tmp_path / "hard.csv")
    os.link(held, tmp_path / "held_hard.csv")
    (tmp_path / "dirlink").symlink_to(tmp_path)
    public_real = glob_public(tmp_path, "pub.csv")
    (tmp_path / "private_link.csv").symlink_to(public_real)  # data.path is a link TO the file declared public
    fd = os.open(private, os.O_RDONLY)
    try:
        cases = {
            "hard link": (tmp_path / "hard.csv", private, {}),
            "/proc/self/root": (f"/proc/self/root{private}", private, {}),
            "/proc/self/fd": (f"/proc/self/fd/{fd}", private, {}),
            "relative vs absolute": ("tickets.csv", private, {}),
            "absolute vs relative": (private, Path("tickets.csv"), {}),
            "double slash and dot": (f"{tmp_path}//./tickets.csv", private, {}),
            "linked folder": (tmp_path / "dirlink" / "dirlink" / "tickets.csv", private, {}),
            "data.path links to it": (public_real, tmp_path / "private_link.csv", {}),
            "eval_path hard link": (tmp_path / "held_hard.csv", private, {"eval_path": str(held)}),
        }
        for name, (public, data_path, extra) in cases.items():
            data = _data(tmp_path, data_path, public, **extra)
            with pytest.raises(BadInputError) as info:
                check_warm_start_file(data)
            message = str(info.value)
            assert "\n" not in message and message.startswith("data.public_warm_start.path="), (name, message)
            assert "is the contract's data." in message and CANARY not in message, (name, message)
    finally:
        os.close(fd)


def test_held_the_precheck_outcome_does_not_depend_on_the_private_contents(tmp_path):
    """For each public file (good, missing, folder, wrong columns, unknown type) the precheck's result is the same
    whatever the private file holds (records, nothing, binary, other columns, absent): paths and identities only."""
    (tmp_path / "folder.csv").mkdir()
    (tmp_path / "cols.csv").write_text("question,answer\nq,a\n")
    (tmp_path / "notes.txt").write_text("message,reply\nq,a\n")
    publics = [glob_public(tmp_path, "pub.csv"), tmp_path / "absent.csv", tmp_path / "folder.csv"]
    publics += [tmp_path / "cols.csv", tmp_path / "notes.txt"]
    private = tmp_path / "private.csv"
    variants = {
        "records": lambda: write_private(private),
        "empty": lambda: private.write_bytes(b""),
        "binary": lambda: private.write_bytes(bytes(range(256)) * 40),
        "other columns": lambda: private.write_text(f"{CANARY},x\n1,2\n"),
        "absent": lambda: private.unlink(),
    }

    def outcome(data) -> str:
        try:
            return check_warm_start_file(data)
        except BadInputError as err:
            return f"refused: {err}"

    seen: dict[str, list[str]] = {}
    for name, make in variants.items():
        make()
        seen[name] = [outcome(_data(tmp_path, private, p)) for p in publics]
        assert not any(CANARY in o for o in seen[name])
    first = seen["records"]
    assert first[0].startswith("OK") and all(o.startswith("refused") for o in first[1:])
    assert all(v == first for v in seen.values()), seen


def test_held_a_warm_start_refusal_after_the_data_is_read_is_the_same_for_any_private_file(
    tmp_path, tiny_model_dir, signing_key
):
    """A public file the header check passes but the warm start's reader refuses (an empty cell): exit 2, the same
    one line for two different private files, nothing written."""
    public = tmp_path / "empty_reply.csv"
    public.write_text("message,reply\n" + "x" * 10 + ",\n")  # an empty reply cell: the reader refuses it
    outputs = []
    for i, rows in enumerate((40, 17)):
        private = write_private(tmp_path / f"private{i}.csv", rows=rows)
        data = {"public_warm_start": {"path": str(public), "steps": 1}}
        result, out = train_tiny(tmp_path, tiny_model_dir, private, signing_key, name=f"run{i}", data=data)
        assert result.exit_code == 2, result.output
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert lines[-1].startswith("error: data.public_warm_start.path=") and CANARY not in result.output
        assert not out.exists() and not Path(f"{out}.partial").exists()
        outputs.append(lines[-1].replace(f"run{i}", "run"))
    assert outputs[0] == outputs[1]


def test_held_the_warm_start_leaves_every_global_generator_as_it_found_it(tiny_model_dir):
    """fit() seeds its dropout inside fork_rng and orders batches with a local generator: torch's, numpy's and
    Python's global states come back unchanged (the DP phase's dropout stays on OS entropy)."""
    from peft import LoraConfig, get_peft_model
    from tiny import byte_tokenizer
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]))
    model.train()
    examples = [([1, 2, 3, 4, 5, 6], [-100, -100, -100, 4, 5, 6])] * 6
    torch.seed()
    state_t, state_np, state_py = torch.get_rng_state(), np.random.get_state(), random.getstate()
    losses = warmstart.fit(
        model, examples, steps=3, batch_size=2, lr=0.01, seed=7, pad_id=byte_tokenizer().pad_token_id, physical=2,
        device=torch.device("cpu"),
    )  # fmt: skip
    assert len(losses) == 3
    assert torch.equal(torch.get_rng_state(), state_t)
    after_np = np.random.get_state()
    assert after_np[0] == state_np[0] and np.array_equal(after_np[1], state_np[1]) and after_np[2:] == state_np[2:]
    assert random.getstate() == state_py
