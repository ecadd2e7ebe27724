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

import json
import os
import shutil
from collections import Counter
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
from tiny import CHATML, save_chat_model

from dplora.data.demo import write_tickets

PARENT_MTIME = 1_000_000_000  # 2001-09-09: the output's parent folder's mtime before the job
# Sizes: 120 demo tickets (row level), 60 with up to 3 exchanges each (ticket level), 60 conversations (customer).


def _assert_neighbours_match(surfaces: list, same: str) -> None:
    """Surfaces of worlds a, a again and b: a twice must match (the control), then a and b (the finding)."""
    control = "\n".join(diff_surfaces(surfaces[0], surfaces[1]))
    assert control == "", f"{same} gave different public output:\n{control}"
    diff = "\n".join(diff_surfaces(surfaces[0], surfaces[2]))
    print(diff)
    assert diff == ""


def _job(world: Path, model: Path, data_path: Path, keys, *, show_private: str = "", **sections) -> dict:
    """Run a CI job's commands in ``world`` (``CI=true``, its own ledger and cache); return its public surface."""
    key, pub = keys
    env = ci_env(world, show_private)
    cfg = surface_contract(world, model, data_path, output=world / "runs" / "run", **sections)
    (world / "prompts.txt").write_text("my card is lost\nwhere is my order\n")
    # the folder above the output exists before the job with a fixed mtime: the run must leave it so (its real
    # mtime after the run would be the run's end), and the "runs/" entry below compares it between the worlds
    (world / "runs").mkdir()
    os.utime(world / "runs", (PARENT_MTIME, PARENT_MTIME))
    run = world / "runs" / "run"
    outputs = [
        run_dplora(["budget", cfg], env),
        run_dplora(["budget", cfg, "--json"], env),
        run_dplora(["train", cfg, "--signing-key", key, "--json"], env),
        run_dplora(["verify", run, "--public-key", pub], env),
        run_dplora(["verify", run, "--public-key", pub, "--json"], env),
        run_dplora(["eval", run], env),
        run_dplora(["eval", run, "--json"], env),
        {
            **run_dplora(
                ["generate", run, "--public-key", pub, "--json", "--max-new-tokens", "3", "--prompt", "hi"], env
            )
        },
        run_dplora(
            ["synth", run, "--rows", "2", "--out", world / "synth.csv", "--prompts", world / "prompts.txt"]
            + ["--signing-key", key, "--max-new-tokens", "3"],
            env,
        ),
        run_dplora(["verify", run, "--public-key", pub, "--synthetic", world / "synth.csv"], env),
        run_dplora(
            ["export", run, "--out", world / "export", "--signing-key", key, "--public-key", pub, "--json"], env
        ),
        run_dplora(["ledger", "show"], env),
        run_dplora(["ledger", "show", "--json"], env),
    ]
    outputs[7]["generated"] = True
    assert outputs[2]["exit"] == 0, outputs[2]
    masks = Masks()
    return public_surface(world, outputs, masks, {"synth.csv": "csv"}), masks


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
        control = "\n".join(diff_surfaces(surfaces[0], surfaces[1]))
        assert control == "", f"the same data twice gave different public output:\n{control}"
        for name in RANDOM_PER_RUN:
            assert masks[0][name] != masks[1][name], f"{name} is the same in two runs on the same data"
    diff = "\n".join(diff_surfaces(surfaces[0], surfaces[2]))
    if diff:
        print(diff)
    return diff


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
    columns, rows = read_text_file(tickets)

    def a(world):
        return write_text_file(world / "data.csv", columns, rows)

    def b(world):
        return write_text_file(world / "data.csv", columns, rows[:-1])

    assert _neighbours(tmp_path, tiny_model_dir, keys, a, b, **ROW_LEVEL) == ""


def test_the_net_catches_private_diagnostics(tmp_path, tiny_model_dir, keys, tickets):
    """The harness can fail: with ``DPLORA_SHOW_PRIVATE=1`` (the operator's switch) the same neighbours differ, in
    the job log's private lines (record counts, held-out numbers, timings) and the private-only JSON fields."""
    columns, rows = read_text_file(tickets)
    a = lambda world: write_text_file(world / "data.csv", columns, rows)  # noqa: E731
    b = lambda world: write_text_file(world / "data.csv", columns, rows[:-1])  # noqa: E731
    diff = _neighbours(tmp_path, tiny_model_dir, keys, a, b, show_private="1", **ROW_LEVEL)
    assert "/outputs[2]/stderr" in diff and "private (not covered by DP)" in diff  # train's job log
    assert "/not_covered_by_dp/unit_stats/num_units: 89 != 88" in diff  # budget --json's private counts


def test_ticket_level_neighbours_publish_the_same(tmp_path, tiny_model_dir, keys, tickets):
    """Ticket level (unit key ticket_id, up to 3 rows a ticket), the ticket with the most rows removed."""
    columns, rows = read_text_file(tickets)
    heaviest = Counter(r["ticket_id"] for r in rows).most_common(1)[0][0]

    def a(world):
        return write_text_file(world / "data.csv", columns, rows)

    def b(world):
        return write_text_file(world / "data.csv", columns, [r for r in rows if r["ticket_id"] != heaviest])

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
        src = write_text_file(world / "twcs.csv", TWCS_COLUMNS, kept)
        args = ["prepare-twcs", src, world / "out.jsonl"] + (["--conversations"] if conversations else [])
        out = run_dplora(args, {"CI": "true", "DPLORA_SHOW_PRIVATE": ""})
        assert out["exit"] == 0, out
        outputs.append(out)
        shutil.move(world, tmp_path / f"done-{name}")
    assert diff_surfaces(*outputs) == []
    assert "12" not in outputs[0]["stdout"] + outputs[0]["stderr"]
    # the switch shows the counts (the operator then owns that log), so the test can fail
    shown = run_dplora(
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
    cfg = surface_contract(world, model, data_path, output=world / "runs" / "run", **sections)
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
        stopped = run_dplora(["train", cfg, "--signing-key", key, "--json", "--no-progress"], env)
    finally:
        checkpoint.fault_point = real
        signal.signal(signal.SIGTERM, handler)
    assert stopped["exit"] == 130, stopped
    failed = (world / "runs" / "run.partial" / "FAILED.json").read_text()
    outputs = [
        stopped,
        {"args": ["FAILED.json"], "exit": 0, "stdout": failed, "stderr": ""},
        run_dplora(["ledger", "show"], env),
        run_dplora(["ledger", "show", "--json"], env),
        run_dplora(["train", cfg, "--signing-key", key, "--json", "--no-progress", "--resume"], env),
        run_dplora(["verify", run, "--public-key", pub, "--json"], env),
        run_dplora(["ledger", "show", "--json"], env),
    ]
    assert outputs[4]["exit"] == 0, outputs[4]
    masks = Masks()
    return public_surface(world, outputs, masks, {}), masks


def test_an_interrupted_then_resumed_job_publishes_the_same(tmp_path, tiny_model_dir, keys, tickets):
    """A job cancelled by its deadline and resumed: A stopped after step 1, the same data again after step 1 (the
    control), then B, one row fewer, stopped after step 2. Besides the progress lines printed before the signal, no
    public output (the job log, --json's error and summary, FAILED.json, `ledger show`, the record, file names and
    mtimes, TensorBoard) may depend on the step the deadline reached."""
    columns, rows = read_text_file(tickets)
    world, surfaces, masks = tmp_path / "world", [], []
    for name, keep, stop_at in (("a", rows, 1), ("a-again", rows, 1), ("b", rows[:-1], 2)):
        world.mkdir()
        data = write_text_file(world / "data.csv", columns, keep)
        surface, mask = _interrupted_job(world, tiny_model_dir, data, keys, stop_at, **ROW_LEVEL)
        surfaces.append(surface)
        masks.append({v: k for k, v in mask.values.items()})
        shutil.move(world, tmp_path / f"done-{name}")
    _assert_neighbours_match(surfaces, "the same data and step twice")


def _sweep_attach_job(world: Path, model: Path, data_path: Path, keys, **sections) -> tuple:
    """A CI job that tunes with `sweep` (one trial charged to a population, picked on public demo tickets; with two,
    which one wins is a DP output, random even on the same data), then
    attaches an audit (surrogate canaries) to the chosen release: the public surface of the sweep, and the attach's
    outputs. The audit's own outcome (canary secrets, which canaries were inserted, the guesses) is drawn from OS
    entropy and its data is the surrogate, never the private file: it cannot depend on the data, and being random
    it is checked for shape, not compared."""
    key, pub = keys
    env = {"CI": "true", "DPLORA_LEDGER": str(world / "ledger.sqlite3"), "DPLORA_CACHE_DIR": str(world / "cache")}
    cfg = surface_contract(world, model, data_path, output=world / "runs" / "run", **sections)
    (world / "runs").mkdir()
    os.utime(world / "runs", (PARENT_MTIME, PARENT_MTIME))
    cap = ["ledger", "set-cap", "tickets", "--epsilon", "100", "--delta", "1e-3", "--unit", "row"]
    outputs = [
        run_dplora([*cap, "--adjacency", "add_remove"], env),
        run_dplora(
            ["sweep", cfg, "training.lr=1e-6", "--out", world / "sweep", "--signing-key", key]
            + ["--eval-tickets", "4", "--no-progress", "--json"],
            env,
        ),
    ]
    assert outputs[1]["exit"] == 0, outputs[1]
    summary = json.loads(outputs[1]["stdout"])
    release = Path(summary["release"])
    outputs += [
        run_dplora(["verify", release, "--public-key", pub, "--json"], env),
        run_dplora(["ledger", "show", "--json"], env),
    ]
    masks = Masks()
    for i, run_id in enumerate(summary["tuning"]["trial_run_ids"]):  # each trial's random id, as a run's run_id
        masks.add(run_id, f"trial_run_id:{i}")
    surface = _dp_losses(public_surface(world, outputs, masks, {}))
    attach = run_dplora(
        ["audit", cfg, "--canaries", "8", "--candidates", "20", "--no-progress", "--threads", "1"]
        + ["--data-source", "surrogate", "--out", world / "audit", "--attach", release, "--signing-key", key],
        env,
    )
    assert attach["exit"] == 0, attach
    verified = json.loads(run_dplora(["verify", release, "--public-key", pub, "--json"], env)["stdout"])
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
    columns, rows = read_text_file(tickets)
    sections = {"privacy": {"num_units": 200, "population": "tickets"}, "training": {"steps": 2, "lr": 1e-6}}
    world, surfaces = tmp_path / "world", []
    for name, keep in (("a", rows), ("a-again", rows), ("b", rows[:-1])):
        world.mkdir()
        data = write_text_file(world / "data.csv", columns, keep)
        surfaces.append(_sweep_attach_job(world, tiny_model_dir, data, keys, **sections)[0])
        shutil.move(world, tmp_path / f"done-{name}")
    _assert_neighbours_match(surfaces, "the same data twice")
