"""Issue 40 item 6, the permanent net: the public surface of every command is the same on neighbouring datasets.

The rule (docs/release.md, "The public surface"): public output is a function of public inputs and DP outputs only.
Each test below builds two *worlds* that differ by one protected unit (a row, a ticket or a customer removed) and
runs, in each, the commands a CI job runs, with ``CI=true`` (the job log is public): ``budget``, ``train``,
``verify``, ``eval``, ``generate``, ``synth``, ``export``, ``ledger show`` and ``prepare-twcs``. Both worlds run in
the SAME absolute folder, one after the other (the first is moved away before the second starts), with the same
contract, file names, model and key, so paths and file names need no mask. Then everything a job can publish is
compared: every command's exit code, stdout and stderr, every ``--json`` document, and every file outside the
``.private`` folders (contents, names and mtimes; TensorBoard events parsed). They must be identical after the
masks of :class:`Masks`, each of which is named and justified there.

Not compared, because they are not public by design: the private input itself (``data.*``), the ledger database
and the calibration cache (operator state in ``$DPLORA_LEDGER``/``$DPLORA_CACHE_DIR``; the ledger is published
through ``ledger show``, which is compared) and ``<run>.private/`` (the private diagnostics' one home).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import re
import shutil
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from tiny import CHATML, save_chat_model
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.data.demo import write_tickets

INPUTS = ("contract.yaml", "prompts.txt")
PARENT_MTIME = 1_000_000_000  # 2001-09-09: the output's parent folder's mtime before the job
NOT_PUBLIC = ("data.", "ledger.sqlite3", "cache", "twcs.csv")  # prefixes: ledger.sqlite3-wal, -shm too
# Sizes: 120 demo tickets (row level), 60 with up to 3 exchanges each (ticket level), 60 conversations (customer).


ESTIMATE_TIMES = re.compile(
    r"(estimate: about )[^()]*?( for \d+ steps \()[\d.e+-]+( s/step: \d+ forward\(s\) of \d+ synthetic records × \d+ "
    r"tokens at )[\d.e+-]+( s on )"
)


class Masks:
    """Named values of one world that may differ between neighbours without depending on the private data.

    Each is replaced, everywhere it appears (stdout, stderr, JSON documents, file contents, decoded DSSE payloads),
    by ``<name>``:

    - ``run_id``: a fresh random id per run (uuid4), not a function of the data;
    - ``started_at``: the wall clock taken BEFORE the data is read (ISO 8601, and as whole epoch seconds where it
      names the TensorBoard event file and stamps every released file's mtime); its neighbour's clock is a
      different moment, not a different dataset;
    - ``sha256:<file>``: the digest of a compared file (adapter weights, card, synthetic file, exported model, a
      signed payload): the file's own content is compared (masked) beside it, so the mask hides nothing new;
    - ``signature``: Ed25519 signatures over payloads that are themselves compared decoded;
    - ``probe time``: the three durations of ``train``'s ``estimate:`` line (total, per step, per synthetic
      forward), the wall time of a forward and backward of SYNTHETIC records (token 1, ``max_seq_len`` tokens) on
      this machine, which differs between any two runs; every other number on that line (T, forwards per step,
      records, tokens, B) stays compared, and ``tests/run/test_estimate.py`` checks that the estimate's inputs are
      identical on neighbouring datasets once the clock is fixed.

    DP outputs are compared by their public shape only, never by value, since they are random by design (fresh
    noise and Poisson batches from OS entropy) even on identical data: safetensors files by their header (tensor
    names, dtypes, shapes) and size, generated text (``generate`` replies, ``synth`` rows) by the number of items.
    """

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.started = 0.0  # started_at in epoch seconds

    def add(self, value, name: str) -> None:
        if value not in (None, ""):
            self.values[str(value)] = f"<{name}>"
        if name.startswith(("sha256:", "record:")):
            self.values[str(value)[:12]] = f"<{name}[:12]>"  # verify prints a digest's first 12 hex digits

    def text(self, text: str) -> str:
        text = ESTIMATE_TIMES.sub(r"\1<probe time>\2<probe time>\3<probe time>\4", text)
        for value in sorted(self.values, key=len, reverse=True):
            text = text.replace(value, self.values[value])
        return text

    def doc(self, obj):
        """A JSON value with masks applied to every string and key; signed payloads decoded and masked too."""
        if isinstance(obj, dict):
            return {self.text(k): ("<signature>" if k == "sig" else self.doc(v)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.doc(v) for v in obj]
        if isinstance(obj, str):
            decoded = _decoded_payload(obj)
            return self.doc(decoded) if decoded is not None else self.text(obj)
        return obj


def _decoded_payload(text: str):
    """The JSON statement inside a DSSE/Sigstore ``payload`` (base64), else None."""
    if len(text) < 40 or not text.startswith("eyJ"):
        return None
    try:
        return json.loads(base64.b64decode(text, validate=True))
    except ValueError:
        return None


def _run(args: list[str], env: dict) -> dict:
    result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return {"args": [str(a) for a in args], "exit": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}


def _safetensors_header(path: Path) -> dict:
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    return {
        "bytes": len(raw),
        "tensors": {k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"},
    }


def _tfevents(path: Path, masks: Masks) -> list:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out = []
    for event in EventFileLoader(str(path)).Load():
        values = [(v.tag, round(float(v.simple_value), 12)) for v in event.summary.value if v.HasField("simple_value")]
        # wall times are the record's start + step (public); compared relative to started_at
        out.append({"wall_time": event.wall_time - masks.started, "step": event.step, "values": values})
    return out


def _generated(kind: str, text: str) -> dict:
    """Generated text (a DP output, random by design): only its public shape."""
    if kind == "jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        return {"lines": len(rows), "keys": [sorted(r) for r in rows], "prompts": [r.get("prompt") for r in rows]}
    rows = list(csv.DictReader(text.splitlines()))
    return {"rows": len(rows), "columns": list(rows[0]) if rows else []}


def _surface(world: Path, outputs: list[dict], masks: Masks, generated: dict[str, str]) -> dict:
    """Everything public in ``world``: outputs of each command and every file outside ``.private`` (masked)."""
    for path in sorted(p for p in world.rglob("*") if p.is_file()):
        masks.add(hashlib.sha256(path.read_bytes()).hexdigest(), f"sha256:{path.relative_to(world)}")
        if path.name.endswith(".dsse.json"):
            envelope = json.loads(path.read_text())
            masks.add(hashlib.sha256(base64.b64decode(envelope["payload"])).hexdigest(), f"record:{path.name}")
            predicate = _decoded_payload(envelope["payload"]).get("predicate", {})
            masks.add(predicate.get("run_id"), "run_id")
            masks.add(predicate.get("started_at"), "started_at")
    for value, name in list(masks.values.items()):
        if name == "<started_at>":
            masks.started = datetime.fromisoformat(value).timestamp()
            masks.add(int(masks.started), "started_at")
    files = {}
    for path in sorted(world.rglob("*")):
        rel = path.relative_to(world)
        if any(part.endswith(".private") for part in rel.parts) or rel.parts[0].startswith(NOT_PUBLIC):
            continue
        key = masks.text(str(rel))
        # the job's own inputs (contract, prompts) carry the user's mtimes; everything dplora wrote is compared
        entry = {"mtime": "input" if str(rel) in INPUTS else masks.text(str(int(path.stat().st_mtime)))}
        if path.is_dir():
            files[key + "/"] = entry
            continue
        if path.suffix == ".safetensors":
            entry["content"] = _safetensors_header(path)
        elif ".tfevents." in path.name:
            entry["content"] = _tfevents(path, masks)
        elif str(rel) in generated:
            entry["content"] = _generated(generated[str(rel)], path.read_text())
        elif path.suffix == ".json":
            entry["content"] = masks.doc(json.loads(path.read_text()))
        else:
            entry["content"] = masks.text(path.read_text())
        files[key] = entry
    shown = []
    for out in outputs:
        item = {"args": masks.text(" ".join(out["args"])), "exit": out["exit"], "stderr": masks.text(out["stderr"])}
        if out.get("generated"):
            item["stdout"] = _generated("jsonl", out["stdout"])
        elif out["stdout"].lstrip().startswith("{"):
            item["stdout"] = masks.doc(json.loads(out["stdout"]))
        else:
            item["stdout"] = masks.text(out["stdout"])
        shown.append(item)
    return {"outputs": shown, "files": files}


def _diff(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in _diff(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _contract(world: Path, model: Path, data_path: Path, output: Path | None = None, **sections) -> Path:
    raw = {
        "privacy": {
            "protected_unit": "row",
            "adjacency": "add_remove",
            "target_epsilon": 8.0,
            "delta": 1e-5,
            "accountant": "rdp",
            "max_grad_norm": 1.0,
        },
        "model": {"path": str(model)},
        "data": {"path": str(data_path), "prompt_column": "message", "response_column": "reply", "eval_fraction": 0.2},
        "lora": {"r": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]},
        "training": {
            "expected_batch_size": 8,
            "physical_batch_size": 4,
            "steps": 3,
            "lr": 0.01,
            "max_seq_len": 48,
            "seed": 0,
            "output_dir": str(output or world / "run"),
            "threads": 1,
        },
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    path = world / "contract.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _job(world: Path, model: Path, data_path: Path, keys, *, show_private: str = "", **sections) -> dict:
    """Run a CI job's commands in ``world`` (``CI=true``, its own ledger and cache); return its public surface."""
    key, pub = keys
    env = {
        "CI": "true",
        "DPLORA_LEDGER": str(world / "ledger.sqlite3"),
        "DPLORA_CACHE_DIR": str(world / "cache"),
        "DPLORA_SHOW_PRIVATE": show_private,
    }
    cfg = _contract(world, model, data_path, output=world / "runs" / "run", **sections)
    (world / "prompts.txt").write_text("my card is lost\nwhere is my order\n")
    # the folder above the output exists before the job with a fixed mtime: the run must leave it so (its real
    # mtime after the run would be the run's end), and the "runs/" entry below compares it between the worlds
    (world / "runs").mkdir()
    os.utime(world / "runs", (PARENT_MTIME, PARENT_MTIME))
    run = world / "runs" / "run"
    outputs = [
        _run(["budget", cfg], env),
        _run(["budget", cfg, "--json"], env),
        _run(["train", cfg, "--signing-key", key, "--json"], env),
        _run(["verify", run, "--public-key", pub], env),
        _run(["verify", run, "--public-key", pub, "--json"], env),
        _run(["eval", run], env),
        _run(["eval", run, "--json"], env),
        {**_run(["generate", run, "--public-key", pub, "--json", "--max-new-tokens", "3", "--prompt", "hi"], env)},
        _run(
            ["synth", run, "--rows", "2", "--out", world / "synth.csv", "--prompts", world / "prompts.txt"]
            + ["--signing-key", key, "--max-new-tokens", "3"],
            env,
        ),
        _run(["verify", run, "--public-key", pub, "--synthetic", world / "synth.csv"], env),
        _run(["export", run, "--out", world / "export", "--signing-key", key, "--public-key", pub, "--json"], env),
        _run(["ledger", "show"], env),
        _run(["ledger", "show", "--json"], env),
    ]
    outputs[7]["generated"] = True
    assert outputs[2]["exit"] == 0, outputs[2]
    masks = Masks()
    return _surface(world, outputs, masks, {"synth.csv": "csv"}), masks


RANDOM_PER_RUN = ("<run_id>", "<record:release.dsse.json>", "<sha256:runs/run/adapter/adapter_model.safetensors>")


def _neighbours(tmp_path: Path, model: Path, keys, write_a, write_b, show_private="", **sections) -> str:
    """Run the job on world A, on A again (the same-data control), then on its neighbour B, in the same folder.

    The control (issue 49: "masks by explicit field name, each justified, plus a same-data control run"): A and A'
    must be identical after the masks, and the masks that stand for per-run randomness (:data:`RANDOM_PER_RUN`)
    must take different values in A and A' although the data is the same, so they stand for randomness, not data.
    Returns the differences between A and B, one a line.
    """
    world, surfaces, masks = tmp_path / "world", [], []
    for name, write in (("a", write_a), ("a-again", write_a), ("b", write_b)):
        world.mkdir()
        surface, mask = _job(world, model, write(world), keys, show_private=show_private, **sections)
        surfaces.append(surface)
        masks.append({v: k for k, v in mask.values.items()})
        shutil.move(world, tmp_path / f"done-{name}")
    if not show_private:
        control = "\n".join(_diff(surfaces[0], surfaces[1]))
        assert control == "", f"the same data twice gave different public output:\n{control}"
        for name in RANDOM_PER_RUN:
            assert masks[0][name] != masks[1][name], f"{name} is the same in two runs on the same data"
    diff = "\n".join(_diff(surfaces[0], surfaces[2]))
    if diff:
        print(diff)
    return diff


def _read(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames), list(reader)


def _write(path: Path, columns: list[str], rows: list[dict]) -> Path:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    from dplora.release.keys import generate_keypair

    return generate_keypair(tmp_path_factory.mktemp("surface-keys") / "ci.key")


@pytest.fixture(scope="module")
def tickets(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("surface-tickets") / "tickets.csv"
    write_tickets(path, num_tickets=60, seed=3, max_turns=3)
    return path


ROW_LEVEL = {
    "privacy": {"num_units": 400},
    "training": {"expected_batch_size": "auto", "steps": "auto", "epochs": 4.0, "report_to": "tensorboard"},
}


def test_row_level_neighbours_publish_the_same(tmp_path, tiny_model_dir, keys, tickets):
    """Row level, prompt/response, a held-out split, TensorBoard and the planner's ``auto`` keys (declared N=400
    over 100-odd rows: the planner's B and T are public), one row removed."""
    columns, rows = _read(tickets)

    def a(world):
        return _write(world / "data.csv", columns, rows)

    def b(world):
        return _write(world / "data.csv", columns, rows[:-1])

    assert _neighbours(tmp_path, tiny_model_dir, keys, a, b, **ROW_LEVEL) == ""


def test_the_net_catches_private_diagnostics(tmp_path, tiny_model_dir, keys, tickets):
    """The harness can fail: with ``DPLORA_SHOW_PRIVATE=1`` (the operator's switch) the same neighbours differ, in
    the job log's private lines (record counts, held-out numbers, timings) and the private-only JSON fields."""
    columns, rows = _read(tickets)
    a = lambda world: _write(world / "data.csv", columns, rows)  # noqa: E731
    b = lambda world: _write(world / "data.csv", columns, rows[:-1])  # noqa: E731
    diff = _neighbours(tmp_path, tiny_model_dir, keys, a, b, show_private="1", **ROW_LEVEL)
    assert "/outputs[2]/stderr" in diff and "private (not covered by DP)" in diff  # train's job log
    assert "/not_covered_by_dp/unit_stats/num_units: 89 != 88" in diff  # budget --json's private counts


def test_ticket_level_neighbours_publish_the_same(tmp_path, tiny_model_dir, keys, tickets):
    """Ticket level (unit key ticket_id, up to 3 rows a ticket), the ticket with the most rows removed."""
    columns, rows = _read(tickets)
    heaviest = Counter(r["ticket_id"] for r in rows).most_common(1)[0][0]

    def a(world):
        return _write(world / "data.csv", columns, rows)

    def b(world):
        return _write(world / "data.csv", columns, [r for r in rows if r["ticket_id"] != heaviest])

    sections = {"privacy": {"protected_unit": "ticket", "unit_key": "ticket_id", "num_units": 60}}
    assert _neighbours(tmp_path, tiny_model_dir, keys, a, b, **sections) == ""


def test_customer_level_chat_neighbours_publish_the_same(tmp_path, keys):
    """Customer level on chat data (messages through a ChatML template), the heaviest customer removed."""
    model = save_chat_model(tmp_path / "chat-model", CHATML)
    source = tmp_path / "conversations.jsonl"
    write_tickets(source, num_tickets=60, seed=5, record_format="messages")
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    heaviest = Counter(r["customer_id"] for r in rows).most_common(1)[0][0]

    def write(keep):
        def make(world):
            path = world / "data.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows if keep(r)))
            return path

        return make

    sections = {
        "privacy": {"protected_unit": "user", "unit_key": "customer_id", "num_units": 40},
        "data": {
            "prompt_column": None,
            "response_column": None,
            "messages_column": "messages",
            "record_format": "messages",
        },
        "training": {"max_seq_len": 256},
    }
    a, b = write(lambda r: True), write(lambda r: r["customer_id"] != heaviest)
    assert _neighbours(tmp_path, model, keys, a, b, **sections) == ""


TWCS_COLUMNS = [
    "tweet_id",
    "author_id",
    "inbound",
    "created_at",
    "text",
    "response_tweet_id",
    "in_response_to_tweet_id",
]


def _twcs_rows(customers: int) -> list[dict]:
    """A tiny TWCS export: each customer tweets a brand once and the brand replies (one or two replies)."""
    rows, tid = [], 1
    for c in range(customers):
        author, brand = str(1000 + c), ("AcmeBank", "ShopCo")[c % 2]
        stamp = f"Tue Oct 31 2{c % 4}:{10 + c:02d}:00 +0000 2017"
        rows.append(
            dict(
                tweet_id=str(tid),
                author_id=author,
                inbound="True",
                created_at=stamp,
                text=f"@{brand} my order {c} never came, call me at 555-01{c:02d}",
                response_tweet_id=str(tid + 1),
                in_response_to_tweet_id="",
            )
        )
        rows.append(
            dict(
                tweet_id=str(tid + 1),
                author_id=brand,
                inbound="False",
                created_at=stamp,
                text=f"@{author} sorry to hear that, please DM us",
                response_tweet_id="",
                in_response_to_tweet_id=str(tid),
            )
        )
        tid += 2
    return rows


@pytest.mark.parametrize("conversations", [False, True], ids=["pairs", "conversations"])
def test_prepare_twcs_neighbours_publish_the_same(tmp_path, conversations):
    """prepare-twcs under CI on a TWCS export and on it without one customer: the same job log, and its output
    file (private data, never published) is the only difference."""
    rows = _twcs_rows(12)
    world, outputs = tmp_path / "world", []
    for name, kept in (("a", rows), ("b", [r for r in rows if "1003" not in (r["author_id"], r["text"][1:5])])):
        world.mkdir()
        src = _write(world / "twcs.csv", TWCS_COLUMNS, kept)
        args = ["prepare-twcs", src, world / "out.jsonl"] + (["--conversations"] if conversations else [])
        out = _run(args, {"CI": "true", "DPLORA_SHOW_PRIVATE": ""})
        assert out["exit"] == 0, out
        outputs.append(out)
        shutil.move(world, tmp_path / f"done-{name}")
    assert _diff(*outputs) == []
    assert "12" not in outputs[0]["stdout"] + outputs[0]["stderr"]
    # the switch shows the counts (the operator then owns that log), so the test can fail
    shown = _run(
        ["prepare-twcs", tmp_path / "done-a" / "twcs.csv", tmp_path / "o.jsonl", "--show-private"], {"CI": "1"}
    )
    assert shown["exit"] == 0 and "12 customers" in shown["stdout"] + shown["stderr"], shown


def _interrupted_job(world: Path, model: Path, data_path: Path, keys, stop_at: int, **sections) -> tuple:
    """A CI job whose first `train` is cancelled (SIGTERM after step ``stop_at``: a deadline that followed the private
    batches' times), then resumed to T: its public surface (progress lines off: they are the documented residual)."""
    import signal

    from dplora.run import checkpoint

    key, pub = keys
    env = {"CI": "true", "DPLORA_LEDGER": str(world / "ledger.sqlite3"), "DPLORA_CACHE_DIR": str(world / "cache")}
    cfg = _contract(world, model, data_path, output=world / "runs" / "run", **sections)
    (world / "runs").mkdir()
    os.utime(world / "runs", (PARENT_MTIME, PARENT_MTIME))
    run = world / "runs" / "run"
    real, handler = checkpoint.fault_point, signal.getsignal(signal.SIGTERM)

    def cancel(point, step):
        if (point, step) == ("after-step", stop_at):
            os.kill(os.getpid(), signal.SIGTERM)
        real(point, step)

    checkpoint.fault_point = cancel
    try:
        stopped = _run(["train", cfg, "--signing-key", key, "--json", "--no-progress"], env)
    finally:
        checkpoint.fault_point = real
        signal.signal(signal.SIGTERM, handler)
    assert stopped["exit"] == 130, stopped
    failed = (world / "runs" / "run.partial" / "FAILED.json").read_text()
    outputs = [
        stopped,
        {"args": ["FAILED.json"], "exit": 0, "stdout": failed, "stderr": ""},
        _run(["ledger", "show"], env),
        _run(["ledger", "show", "--json"], env),
        _run(["train", cfg, "--signing-key", key, "--json", "--no-progress", "--resume"], env),
        _run(["verify", run, "--public-key", pub, "--json"], env),
        _run(["ledger", "show", "--json"], env),
    ]
    assert outputs[4]["exit"] == 0, outputs[4]
    masks = Masks()
    return _surface(world, outputs, masks, {}), masks


def test_an_interrupted_then_resumed_job_publishes_the_same(tmp_path, tiny_model_dir, keys, tickets):
    """A job cancelled by its deadline and resumed: A stopped after step 1, the same data again after step 1 (the
    control), then B, one row fewer, stopped after step 2. Besides the progress lines printed before the signal, no
    public output (the job log, --json's error and summary, FAILED.json, `ledger show`, the record, file names and
    mtimes, TensorBoard) may depend on the step the deadline reached."""
    columns, rows = _read(tickets)
    world, surfaces, masks = tmp_path / "world", [], []
    for name, keep, stop_at in (("a", rows, 1), ("a-again", rows, 1), ("b", rows[:-1], 2)):
        world.mkdir()
        data = _write(world / "data.csv", columns, keep)
        surface, mask = _interrupted_job(world, tiny_model_dir, data, keys, stop_at, **ROW_LEVEL)
        surfaces.append(surface)
        masks.append({v: k for k, v in mask.values.items()})
        shutil.move(world, tmp_path / f"done-{name}")
    control = "\n".join(_diff(surfaces[0], surfaces[1]))
    assert control == "", f"the same data and step twice gave different public output:\n{control}"
    diff = "\n".join(_diff(surfaces[0], surfaces[2]))
    print(diff)
    assert diff == ""


def _sweep_attach_job(world: Path, model: Path, data_path: Path, keys, **sections) -> tuple:
    """A CI job that tunes with `sweep` (one trial charged to a population, picked on public demo tickets; with two,
    which one wins is a DP output, random even on the same data), then
    attaches an audit (surrogate canaries) to the chosen release: the public surface of the sweep, and the attach's
    outputs. The audit's own outcome (canary secrets, which canaries were inserted, the guesses) is drawn from OS
    entropy and its data is the surrogate, never the private file: it cannot depend on the data, and being random
    it is checked for shape, not compared."""
    key, pub = keys
    env = {"CI": "true", "DPLORA_LEDGER": str(world / "ledger.sqlite3"), "DPLORA_CACHE_DIR": str(world / "cache")}
    cfg = _contract(world, model, data_path, output=world / "runs" / "run", **sections)
    (world / "runs").mkdir()
    os.utime(world / "runs", (PARENT_MTIME, PARENT_MTIME))
    cap = ["ledger", "set-cap", "tickets", "--epsilon", "100", "--delta", "1e-3", "--unit", "row"]
    outputs = [
        _run([*cap, "--adjacency", "add_remove"], env),
        _run(
            ["sweep", cfg, "training.lr=1e-6", "--out", world / "sweep", "--signing-key", key]
            + ["--eval-tickets", "4", "--no-progress", "--json"],
            env,
        ),
    ]
    assert outputs[1]["exit"] == 0, outputs[1]
    summary = json.loads(outputs[1]["stdout"])
    release = Path(summary["release"])
    outputs += [_run(["verify", release, "--public-key", pub, "--json"], env), _run(["ledger", "show", "--json"], env)]
    masks = Masks()
    for i, run_id in enumerate(summary["tuning"]["trial_run_ids"]):  # each trial's random id, as a run's run_id
        masks.add(run_id, f"trial_run_id:{i}")
    surface = _dp_losses(_surface(world, outputs, masks, {}))
    attach = _run(
        ["audit", cfg, "--canaries", "8", "--candidates", "20", "--no-progress", "--threads", "1"]
        + ["--data-source", "surrogate", "--out", world / "audit", "--attach", release, "--signing-key", key],
        env,
    )
    assert attach["exit"] == 0, attach
    verified = json.loads(_run(["verify", release, "--public-key", pub, "--json"], env)["stdout"])
    assert verified["ok"] and "audit" in json.dumps(verified)
    return surface, masks


def _dp_losses(obj, parent: str = ""):
    """``obj`` with the losses of a trial's noisy adapters on the public selection tickets (``held_out_loss``; the
    ``adapter`` side of the selection's evaluation: DP outputs, random by design even on the same data) replaced by
    their presence; the base model's loss on them, the choice, the trials' ε and everything else stay compared."""
    if isinstance(obj, dict):
        dp = {"held_out_loss"} | ({"loss", "perplexity"} if parent == "adapter" else set())
        return {k: ("<dp output>" if k in dp else _dp_losses(v, k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_dp_losses(v, parent) for v in obj]
    return obj


def test_a_sweep_with_an_attached_audit_publishes_the_same(tmp_path, tiny_model_dir, keys, tickets):
    """`sweep` (and then `audit --attach`) under CI=true on neighbours (one row removed), with the same-data
    control: the comparison isolates what the data could change."""
    columns, rows = _read(tickets)
    sections = {"privacy": {"num_units": 200, "population": "tickets"}, "training": {"steps": 2, "lr": 1e-6}}
    world, surfaces = tmp_path / "world", []
    for name, keep in (("a", rows), ("a-again", rows), ("b", rows[:-1])):
        world.mkdir()
        data = _write(world / "data.csv", columns, keep)
        surfaces.append(_sweep_attach_job(world, tiny_model_dir, data, keys, **sections)[0])
        shutil.move(world, tmp_path / f"done-{name}")
    control = "\n".join(_diff(surfaces[0], surfaces[1]))
    assert control == "", f"the same data twice gave different public output:\n{control}"
    diff = "\n".join(_diff(surfaces[0], surfaces[2]))
    print(diff)
    assert diff == ""
