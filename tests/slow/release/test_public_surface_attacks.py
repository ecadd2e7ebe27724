"""Red team (issue 40): public outputs that differ between neighbouring datasets, beyond what DP outputs explain.

Each test builds two worlds that differ by one protected unit, runs a CI job's commands in each (``CI=true``, the
job log is public) in the same folder, and compares the public surface with the masks of
:mod:`test_public_surface`. A test here FAILS while the finding stands (it asserts the rule of docs/release.md,
"The public surface": public output is a function of public inputs and DP outputs only).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from support.public_surface import (
    Masks,
    ci_env,
    diff_surfaces,
    public_surface,
    read_text_file,
    run_dplora,
    surface_contract,
    write_text_file,
)

from dplora.data.demo import write_tickets


def _slow_down(monkeypatch, module, name: str) -> None:
    """``module.name`` takes a second longer (a tiny sweep trial or audit report finishes in < 1 s)."""
    real = getattr(module, name)

    def slow(*args, **kwargs):
        time.sleep(1.1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, slow)


def _compare(tmp_path: Path, model: Path, write_a, write_b, commands, **sections) -> list[str]:
    """Run ``commands(world, contract, env)`` (a list of ``_run`` results) on world A then B in the same folder;
    return the differences of the public surfaces."""
    world, surfaces = tmp_path / "world", []
    _compare.exits = []  # each world's exit codes, for the held tests to check the commands ran as meant
    for name, write in (("a", write_a), ("b", write_b)):
        world.mkdir()
        cfg = surface_contract(world, model, write(world), **sections)
        outputs = commands(world, cfg, ci_env(world))
        _compare.exits.append([out["exit"] for out in outputs])
        for out in outputs:  # shown when a test fails
            print(name, out["args"][0], "exit", out["exit"], (out["stderr"] + out["stdout"]).strip()[-300:])
        surfaces.append(public_surface(world, outputs, Masks(), {}))
        shutil.move(world, tmp_path / f"done-{name}")
    diff = diff_surfaces(*surfaces)
    print("\n".join(d[:400] for d in diff))
    return diff


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("attack-tickets") / "tickets.csv"
    write_tickets(path, num_tickets=60, seed=3, max_turns=1)
    return read_text_file(path)


def test_eval_fraction_split_refusal_depends_on_one_unit(tmp_path, tiny_model_dir, signing_key, rows):
    """Finding: ``data.eval_fraction`` refuses a split that leaves the held-out side empty, with exit 2 and the
    private record count in the job log. World A holds exactly one held-out row (row 13 of the demo file at
    fraction 0.02, seed 0); its neighbour B lacks that row: A trains (exit 0), B is refused with
    "leaves the held-out side empty (58 records)" — whether a release exists, and the exact N, are published."""
    columns, table = rows
    a_rows = [r for i, r in enumerate(table) if i != 37]  # rows 12 and 37 are the held-out ones at 0.02
    b_rows = [r for i, r in enumerate(a_rows) if i != 12]

    def commands(world, cfg, env):
        train = ["train", cfg, "--signing-key", signing_key[0], "--json"]
        return [run_dplora(["budget", cfg, "--json"], env), run_dplora(train, env)]

    sections = {"privacy": {"num_units": 100}, "data": {"eval_fraction": 0.02}}
    diff = _compare(
        tmp_path,
        tiny_model_dir,
        lambda w: write_text_file(w / "data.csv", columns, a_rows),
        lambda w: write_text_file(w / "data.csv", columns, b_rows),
        commands,
        **sections,
    )
    assert diff == []


def _held_out_rows(columns, table, fraction: float, seed: int = 0) -> list[int]:
    from dplora.data.units import held_out_unit

    return [i for i, r in enumerate(table) if held_out_unit(r["message"] + "\x1f" + r["reply"], seed, fraction)]


@pytest.mark.parametrize("selection", ["--eval-contract", "--eval-private"])
def test_sweep_on_a_private_set_publishes_held_out_losses(tmp_path, tiny_model_dir, signing_key, rows, selection):
    """Finding: ``sweep --eval-contract`` (or ``--eval-private FILE``) prints each trial's held-out loss on the
    PRIVATE selection set on stderr under CI ("sweep: trial i: ε=…, held-out loss 5.1234 (NOT COVERED BY DP…)")
    and writes the losses to ``<out>/sweep.json`` beside the sweep (outside any ``.private`` folder). With
    lr = 1e-6 the adapters equal the base model to printing precision, so the losses are a deterministic function
    of the held-out records: removing one held-out row changes them."""
    columns, table = rows
    held = _held_out_rows(columns, table, 0.2)
    assert len(held) >= 3

    def write(keep):
        def make(world):
            if selection == "--eval-private":  # a private file of its own: the neighbour lacks one of its rows
                write_text_file(world / "data.eval.csv", columns, [r for i, r in enumerate(keep) if i in held])
            return write_text_file(world / "data.csv", columns, keep)

        return make

    def commands(world, cfg, env):
        pick = [selection] + ([world / "data.eval.csv"] if selection == "--eval-private" else [])
        sweep = ["sweep", cfg, "training.lr=1e-6", "--out", world / "sweep", "--no-progress"]
        sweep += ["--signing-key", signing_key[0], *pick]
        return [
            run_dplora(
                ["ledger", "set-cap", "tickets", "--epsilon", "100", "--delta", "1e-3"]
                + ["--unit", "row", "--adjacency", "add_remove"],
                env,
            ),
            run_dplora(sweep, env),
        ]

    sections = {
        "privacy": {"num_units": 100, "population": "tickets"},
        "data": {"eval_fraction": 0.2 if selection == "--eval-contract" else None},
        "training": {"steps": 1},
    }
    a_rows, b_rows = table, [r for i, r in enumerate(table) if i != held[0]]
    diff = _compare(tmp_path, tiny_model_dir, write(a_rows), write(b_rows), commands, **sections)
    # the sweep's release mtimes are another finding (test_sweep_release_files_carry_the_wall_clock)
    assert [d for d in diff if "held_out_loss" in d or d.startswith("/outputs")] == []


def test_sweep_release_files_carry_the_wall_clock(tmp_path, tiny_model_dir, signing_key, rows, monkeypatch):
    """Finding: the release ``sweep`` makes (the chosen trial, re-signed with the user's key) keeps the mtimes of
    the moment it was re-signed, after every trial ran, on the record, the card, the adapter config and the
    folders (and ``sweep.json``): its end time, where every released file must carry the record's ``started_at``
    (docs/release.md); end - start is the sweep's private wall time (``_release`` never calls ``fix_mtimes``).
    The sleep only makes the sweep last past one clock second, as any real sweep does."""
    import base64
    import json
    from datetime import datetime

    from dplora.tuning import sweep as sweep_mod

    _slow_down(monkeypatch, sweep_mod, "tuning_entry")  # a sweep whose trials take a second longer

    columns, table = rows
    world = tmp_path / "world"
    world.mkdir()
    cfg = surface_contract(
        world,
        tiny_model_dir,
        write_text_file(world / "data.csv", columns, table),
        privacy={"num_units": 100, "population": "tickets"},
        training={"steps": 1},
    )
    env = ci_env(world)
    cap = ["ledger", "set-cap", "tickets", "--epsilon", "100", "--delta", "1e-3", "--unit", "row"]
    assert run_dplora([*cap, "--adjacency", "add_remove"], env)["exit"] == 0
    out = run_dplora(
        [
            "sweep",
            cfg,
            "training.lr=0.01",
            "--out",
            world / "sweep",
            "--signing-key",
            signing_key[0],
            "--eval-tickets",
            "4",
            "--no-progress",
            "--json",
        ],
        env,
    )
    assert out["exit"] == 0, out
    release = Path(json.loads(out["stdout"])["release"])
    envelope = json.loads((release / "release.dsse.json").read_text())

    started = datetime.fromisoformat(json.loads(base64.b64decode(envelope["payload"]))["predicate"]["started_at"])
    stamps = {
        str(p.relative_to(world)): int(p.stat().st_mtime) - int(started.timestamp())
        for p in sorted([release, *release.rglob("*"), world / "sweep" / "sweep.json"])
    }
    print(stamps)
    assert {k: v for k, v in stamps.items() if v != 0} == {}


@pytest.fixture(scope="module")
def ticket_rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("attack-tickets3") / "tickets.csv"
    write_tickets(path, num_tickets=40, seed=3, max_turns=3)
    return read_text_file(path)


def _masked_data_digest(diff: list[str]) -> list[str]:
    """Drop the keyed data digest (a fresh random salt and an HMAC under the owner's secret key: random to anyone
    without the key) and the audit's DP outputs (scores, losses, exposures of the DP model; canaries drawn at
    random)."""
    random = ("/data/digest/", "/per_canary", "epsilon_lower_bound", "mia_auc", "exposure_", "/correct", "/guesses")
    random += ("/keyid", "/hint", "audit-run.pub/content", "owner.key")  # the audit run's throw-away key; an input
    timing = ("run-audit//mtime", "run-audit/audit", "run-audit/audit-run.pub/mtime")  # see the audit mtime test
    return [d for d in diff if not any(r in d.split(": ")[0] for r in random + timing)]


def test_ticket_level_with_data_key_eval_path_auto_batch_and_audit_held(
    tmp_path, tiny_model_dir, signing_key, ticket_rows
):
    """Held (no finding): ticket level, a cap of 2 records a ticket, a data key, a PRIVATE held-out file
    (data.eval_path) with a group column, ``physical_batch_size: auto``, TensorBoard, checkpoints every step,
    ``validate``, ``clip-guide`` (demo sample), ``verify --data --data-key``, ``eval --json``; the
    heaviest ticket removed (from the training file; the held-out file is the same in both worlds)."""
    from collections import Counter

    columns, table = ticket_rows
    heaviest = Counter(r["ticket_id"] for r in table).most_common(1)[0][0]
    held_out = table[-6:]

    def write(keep):
        def make(world):
            write_text_file(world / "data.eval.csv", columns, held_out)
            return write_text_file(world / "data.csv", columns, [r for r in table[:-6] if keep(r)])

        return make

    def commands(world, cfg, env):
        (world / "owner.key").write_bytes(b"0123456789abcdef0123456789abcdef")
        key, pub, run = signing_key[0], signing_key[1], world / "run"
        return [
            run_dplora(["validate", cfg, "--json"], env),
            run_dplora(["clip-guide", cfg, "--json", "--sample", "8", "--threads", "1"], env),
            run_dplora(["budget", cfg, "--json"], env),
            run_dplora(["train", cfg, "--signing-key", key, "--data-key", world / "owner.key", "--json"], env),
            run_dplora(
                ["verify", run, "--public-key", pub, "--data", world / "data.csv", "--data-key", world / "owner.key"],
                env,
            ),
            run_dplora(["eval", run, "--json"], env),
        ]

    sections = {
        "privacy": {"protected_unit": "ticket", "unit_key": "ticket_id", "num_units": 40, "max_records_per_unit": 2},
        "data": {
            "eval_fraction": None,
            "eval_path": str(tmp_path / "world" / "data.eval.csv"),
            "group_column": "customer_id",
        },
        "training": {"physical_batch_size": "auto", "report_to": "tensorboard", "checkpoint_every": 1},
    }
    a, b = write(lambda r: True), write(lambda r: r["ticket_id"] != heaviest)
    diff = _masked_data_digest(_compare(tmp_path, tiny_model_dir, a, b, commands, **sections))
    print("FILTERED", *diff, sep="\n")
    assert _compare.exits == [[0] * 6] * 2
    assert diff == []


def test_audit_report_carries_the_wall_clock(tmp_path, tiny_model_dir, rows, monkeypatch):
    """Finding: ``audit`` writes ``<out>-audit/audit.json`` and ``audit.md`` (the documents ``--attach`` signs into
    a release) with the wall-clock mtime of the audit's end, while its run's record says when that run started
    (``run_id`` and the run's ``started_at``): their difference is the audit run's wall time, a function of the
    private realised batches (and the audit trains on the private data by default). The sleep only makes the
    scoring last past one clock second, as a real audit does."""
    import base64
    import json
    from datetime import datetime

    from dplora.audit import runner

    _slow_down(monkeypatch, runner, "_report")
    columns, table = rows
    world = tmp_path / "world"
    world.mkdir()
    cfg = surface_contract(
        world, tiny_model_dir, write_text_file(world / "data.csv", columns, table), privacy={"num_units": 100}
    )
    out = run_dplora(
        ["audit", cfg, "--canaries", "4", "--candidates", "8", "--no-progress", "--threads", "1"], ci_env(world)
    )
    assert out["exit"] == 0, out
    audit = world / "run-audit"
    envelope = json.loads((audit / "run" / "release.dsse.json").read_text())
    started = json.loads(base64.b64decode(envelope["payload"]))["predicate"]["started_at"]
    start = int(datetime.fromisoformat(started).timestamp())
    stamps = {p.name: int(p.stat().st_mtime) - start for p in (audit / "audit.json", audit / "audit.md")}
    print(stamps)
    assert stamps == {"audit.json": 0, "audit.md": 0}


@pytest.mark.parametrize("adjacency", ["add_remove", "replace_one"])
def test_budget_and_train_without_a_declared_n_held(tmp_path, tiny_model_dir, signing_key, rows, adjacency):
    """Held (no finding): no ``privacy.num_units`` under add/remove (train refused without the count, budget
    prints no counted plan under CI) and under replace-one with a held-out split (the same refusal); one row
    removed (add/remove) or replaced by a new one (replace-one). ``budget --sweep``, ``--recommend`` too."""
    columns, table = rows
    other = dict(table[0], message="a brand new message nobody sent", reply="and a new reply")
    b_rows = table[:-1] if adjacency == "add_remove" else [*table[:-1], other]

    def commands(world, cfg, env):
        return [
            run_dplora(["budget", cfg], env),
            run_dplora(["budget", cfg, "--json"], env),
            run_dplora(["budget", cfg, "--json", "--sweep"], env),
            run_dplora(["budget", cfg, "--json", "--recommend"], env),
            run_dplora(["train", cfg, "--signing-key", signing_key[0], "--json"], env),
            run_dplora(["train", cfg, "--signing-key", signing_key[0]], env),
        ]

    sections = {
        "privacy": {"adjacency": adjacency, "accountant": "pld" if adjacency == "replace_one" else "rdp"},
        "data": {"eval_fraction": 0.2},
    }
    a = lambda w: write_text_file(w / "data.csv", columns, table)  # noqa: E731
    b = lambda w: write_text_file(w / "data.csv", columns, b_rows)  # noqa: E731
    assert _compare(tmp_path, tiny_model_dir, a, b, commands, **sections) == []
    assert _compare.exits == [[2] * 6] * 2  # every command refused: no counted private N, in either world


SMOLLM2_TOKENIZER = Path.home() / ".cache" / "dplora" / "models" / "smollm2-135m-instruct"


@pytest.mark.skipif(not (SMOLLM2_TOKENIZER / "tokenizer.json").is_file(), reason="needs the SmolLM2 tokenizer cache")
def test_one_reply_starting_with_two_spaces_refuses_the_whole_run(tmp_path, signing_key):
    """Finding: with SmolLM2's own BPE tokenizer and chat template (the packaged model dplora recommends) and
    ``train_on: assistant``, ONE conversation whose reply starts with two spaces (or two newlines) refuses the
    whole run with exit 2, "data row N: the chat template is not prefix-stable" — the BPE merges the generation
    prompt's ``\\n`` with the reply's leading whitespace, so the context's tokens are not a prefix of the full
    rendering. World B holds such a customer, its neighbour A does not: A releases (exit 0), B is refused, and the
    job log names the row. Unlike a bad cell (docs/sharp_edges.md, "A refusal that depends on one unit") nothing
    is wrong with the record, and the message sends the operator to change the template."""
    import json

    from tiny import tiny_llama
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2_TOKENIZER)
    model = tmp_path / "smol-tiny"
    tiny_llama(vocab_size=len(tokenizer)).save_pretrained(model)
    tokenizer.save_pretrained(model)
    source = tmp_path / "conversations.jsonl"
    write_tickets(source, num_tickets=20, seed=5, record_format="messages")
    convs = [json.loads(line) for line in source.read_text().splitlines()]
    odd = {
        "customer_id": "C-99999",
        "messages": [
            {"role": "user", "content": "where is my parcel?"},
            {"role": "assistant", "content": "  It left our depot today."},
        ],
    }

    def write(rows):
        def make(world):
            path = world / "data.jsonl"
            path.write_text("".join(json.dumps({k: r[k] for k in ("customer_id", "messages")}) + "\n" for r in rows))
            return path

        return make

    def commands(world, cfg, env):
        return [run_dplora(["train", cfg, "--signing-key", signing_key[0], "--json"], env)]

    sections = {
        "privacy": {"protected_unit": "user", "unit_key": "customer_id", "num_units": 40},
        "data": {
            "prompt_column": None,
            "response_column": None,
            "messages_column": "messages",
            "record_format": "messages",
            "eval_fraction": None,
        },
        "training": {"max_seq_len": 96},
    }
    diff = _compare(tmp_path, model, write(convs), write([*convs, odd]), commands, **sections)
    assert diff == []


def test_the_folder_train_creates_above_the_release_carries_the_end_time(
    tmp_path, tiny_model_dir, signing_key, rows, monkeypatch
):
    """Finding (low): with ``training.output_dir: jobs/run`` dplora creates ``jobs/`` and publishes the release into
    it at the end (renames of ``run.partial`` → ``run``, ``run.private`` written last): ``jobs/``'s mtime is the
    run's END, while every file inside carries ``started_at``. A CI job that uploads ``jobs/`` as an artifact (zip
    and tar keep folder mtimes) publishes end - start, the private run's wall time. The sleep only makes training
    last past one clock second, as a real run does."""
    import base64
    import json
    import time
    from datetime import datetime

    from dplora.run import checkpoint

    def slow(point, _step):
        if point == "loop-start":  # the locked run's train phase
            time.sleep(1.1)

    columns, table = rows
    world = tmp_path / "world"
    world.mkdir()
    cfg = surface_contract(
        world,
        tiny_model_dir,
        write_text_file(world / "data.csv", columns, table),
        privacy={"num_units": 100},
        training={"output_dir": str(world / "jobs" / "run")},
    )
    with checkpoint.fault_hook(slow):
        out = run_dplora(["train", cfg, "--signing-key", signing_key[0], "--json"], ci_env(world))
    assert out["exit"] == 0, out
    envelope = json.loads((world / "jobs" / "run" / "release.dsse.json").read_text())
    started = json.loads(base64.b64decode(envelope["payload"]))["predicate"]["started_at"]
    start = int(datetime.fromisoformat(started).timestamp())
    stamps = {p.name: int(p.stat().st_mtime) - start for p in (world / "jobs", world / "jobs" / "run")}
    print(stamps)
    assert stamps == {"jobs": 0, "run": 0}


def _hexless(out: dict) -> dict:
    """``out`` with run ids (32 hex digits) and digests (64) in its stdout masked (random per run)."""
    import re

    return {**out, "stdout": re.sub(r"\b(?:[0-9a-f]{64}|[0-9a-f]{32})\b", "<hex>", out["stdout"])}


def test_population_ledger_and_tuning_trial_held(tmp_path, tiny_model_dir, signing_key, rows):
    """Held (no finding): a ledger population (``ledger set-cap``, ``ledger check``), a release and a tuning-trial
    charge on it, ``ledger show`` (text and ``--json``) and ``verify``; one row removed."""
    columns, table = rows

    def commands(world, cfg, env):
        key, run = signing_key[0], world / "run"
        cap = ["ledger", "set-cap", "tickets", "--epsilon", "100", "--delta", "1e-3", "--unit", "row"]
        return [
            run_dplora([*cap, "--adjacency", "add_remove"], env),
            run_dplora(["ledger", "check", "tickets", "--epsilon", "8", "--delta", "1e-5"], env),
            run_dplora(["train", cfg, "--signing-key", key, "--json"], env),
            run_dplora(["train", cfg, "--signing-key", key, "--tuning-trial", "--overwrite", "--json"], env),
            run_dplora(["verify", run, "--public-key", signing_key[1], "--json"], env),
            _hexless(run_dplora(["ledger", "show"], env)),
            run_dplora(["ledger", "show", "--json"], env),
        ]

    sections = {"privacy": {"num_units": 100, "population": "tickets"}}
    a = lambda w: write_text_file(w / "data.csv", columns, table)  # noqa: E731
    b = lambda w: write_text_file(w / "data.csv", columns, table[:-1])  # noqa: E731
    diff = _compare(tmp_path, tiny_model_dir, a, b, commands, **sections)
    assert _compare.exits == [[0] * 7] * 2
    # the first (overwritten) run's id and record digest are not in any compared file, so not masked: random
    diff = [d for d in diff if not d.split(": ")[0].endswith(("/run_id", "/record_sha256"))]
    assert diff == []


def test_audit_attach_leaves_the_release_with_the_attach_time(tmp_path, tiny_model_dir, signing_key, rows):
    """Finding: ``audit --attach RUN`` re-signs the release's record and rewrites its card, and leaves both (and
    ``release.sigstore.json``) with the wall-clock mtime of the attach, where every released file must carry the
    record's ``started_at`` (``fix_mtimes`` is never called after the rewrite). In a CI job that runs ``train``
    then ``audit --attach``, mtime − started_at = train's wall time + the audit's, both private."""
    import base64
    import json
    from datetime import datetime

    columns, table = rows
    world = tmp_path / "world"
    world.mkdir()
    cfg = surface_contract(
        world, tiny_model_dir, write_text_file(world / "data.csv", columns, table), privacy={"num_units": 100}
    )
    env, key, run = ci_env(world), signing_key[0], world / "run"
    assert run_dplora(["train", cfg, "--signing-key", key, "--json"], env)["exit"] == 0
    audit = ["audit", cfg, "--canaries", "4", "--candidates", "8", "--no-progress", "--threads", "1"]
    out = run_dplora([*audit, "--attach", run, "--signing-key", key, "--out", world / "audit"], env)
    assert out["exit"] == 0, out
    envelope = json.loads((run / "release.dsse.json").read_text())
    predicate = json.loads(base64.b64decode(envelope["payload"]))["predicate"]
    assert "audit" in json.dumps(predicate)  # attached
    start = int(datetime.fromisoformat(predicate["started_at"]).timestamp())
    stamps = {str(p.relative_to(run)): int(p.stat().st_mtime) - start for p in sorted([run, *run.rglob("*")])}
    print(stamps)
    assert {k: v for k, v in stamps.items() if v != 0} == {}


def test_a_jsonl_group_column_that_only_one_unit_has_decides_the_run(tmp_path, tiny_model_dir, signing_key, rows):
    """Finding: in jsonl a column exists when ANY record has the key. With ``data.group_column: category`` and a
    held-out split, world A has one held-out record carrying ``category`` and trains (exit 0); its neighbour B
    lacks that record, so the held-out table has no such column and ``train`` refuses (exit 2, "the held-out data
    has no column 'category' (the group column)"). Whether a release exists depends on one unit's keys; the
    contract's declared public label does not make the column's presence public."""
    import json

    columns, table = rows
    held = _held_out_rows(columns, table, 0.2)

    def write(keep):
        def make(world):
            path = world / "data.jsonl"
            lines = [dict(r, category="billing") if i == held[0] else dict(r) for i, r in enumerate(table)]
            path.write_text("".join(json.dumps(r) + "\n" for i, r in enumerate(lines) if keep(i)))
            return path

        return make

    def commands(world, cfg, env):
        return [run_dplora(["train", cfg, "--signing-key", signing_key[0], "--json"], env)]

    sections = {"privacy": {"num_units": 100}, "data": {"eval_fraction": 0.2, "group_column": "category"}}
    diff = _compare(
        tmp_path, tiny_model_dir, write(lambda i: True), write(lambda i: i != held[0]), commands, **sections
    )
    assert diff == []


def test_resume_after_a_kill_held(tmp_path, tiny_model_dir, signing_key, rows):
    """Held (no finding): ``train`` SIGKILLed after step 2 of 3 (``$DPLORA_TEST_FAULT``, a real process), then
    ``train --resume --json`` and ``ledger show``; one row removed. The resumed release and its job log match."""
    import os
    import subprocess
    import sys

    columns, table = rows

    def commands(world, cfg, env):
        run = dict(os.environ, **env, PYTHONPATH=str(Path(__file__).resolve().parents[3]))
        train = [sys.executable, "-m", "dplora", "train", str(cfg), "--signing-key", str(signing_key[0]), "--json"]
        outs = []
        for extra, fault in (([], "after-step:2"), (["--resume"], "")):
            p = subprocess.run([*train, *extra], env=dict(run, DPLORA_TEST_FAULT=fault), capture_output=True, text=True)
            outs.append({"args": [*train[3:], *extra], "exit": p.returncode, "stdout": p.stdout, "stderr": p.stderr})
        return [*outs, _hexless(run_dplora(["ledger", "show"], env))]

    sections = {"privacy": {"num_units": 100}, "training": {"checkpoint_every": 1}}
    a = lambda w: write_text_file(w / "data.csv", columns, table)  # noqa: E731
    b = lambda w: write_text_file(w / "data.csv", columns, table[:-1])  # noqa: E731
    diff = _compare(tmp_path, tiny_model_dir, a, b, commands, **sections)
    assert _compare.exits == [[-9, 0, 0]] * 2
    # peft writes target_modules from a set: their order follows the process's string-hash seed (PYTHONHASHSEED),
    # random per process and not a function of the data (CliRunner's one process never shows it)
    assert [d for d in diff if "/target_modules[" not in d] == []
