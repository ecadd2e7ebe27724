"""The slow tier of tests/ledger/test_ledger.py, whose docstring describes the module."""

from __future__ import annotations

import multiprocessing as mp
from decimal import Decimal
from pathlib import Path

from support.ledger import POP, SHA, capped_ledger, ledger_db, shared_reserve

from dplora.errors import PlanRefusedError
from dplora.ledger.store import Ledger

db = ledger_db  # the two fixtures both tiers use
ledger = capped_ledger


def _reserve_worker(path: str, run_id: str, barrier, results) -> None:
    try:
        with Ledger(Path(path), timeout_s=30.0) as led:
            barrier.wait(timeout=60)
            shared_reserve(led, run_id, "1.0")
        results.put((run_id, "ok"))
    except PlanRefusedError as e:
        results.put((run_id, f"refused: {e}"))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        results.put((run_id, f"error: {e!r}"))


def _settle_release_worker(path: str, i: int, barrier, results) -> None:
    try:
        with Ledger(Path(path), timeout_s=30.0) as led:
            barrier.wait(timeout=60)
            for k in range(3):
                led.record_release(run_id="shared", record_sha256=SHA[10 * i + k], epsilon=f"1.{i}{k}", delta=0)
            led.settle(f"run-{i}", epsilon_spent=f"0.{i + 1}", status="failed" if i % 2 else "settled")
            for k in range(3):
                sha = SHA[50 + 5 * i + k]
                led.record_release(run_id=f"run-{i}", record_sha256=sha, epsilon=f"0.{i + 1}", delta="1e-7")
        results.put((i, "ok"))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        results.put((i, f"error: {e!r}"))


def _run_workers(target, args_list) -> list:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(len(args_list)), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, barrier, results)) for args in args_list]
    for p in procs:
        p.start()
    out = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return out


def test_concurrent_reservations_never_overspend(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"
    with Ledger(db) as led:
        led.set_cap(POP, epsilon_max="5.0", delta_max="1e-3", protected_unit="row", adjacency="add_remove")
    results = dict(_run_workers(_reserve_worker, [(str(db), f"run-{i}") for i in range(8)]))
    assert not [v for v in results.values() if v.startswith("error")], results
    ok = sorted(k for k, v in results.items() if v == "ok")
    assert len(ok) == 5 and sum(v.startswith("refused") for v in results.values()) == 3
    with Ledger(db) as led:
        assert sorted(c.run_id for c in led.charges(POP)) == ok
        assert led.spent(POP)[0] == Decimal("5.0")


def test_concurrent_settle_and_release_lose_no_update(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"
    with Ledger(db) as led:
        led.set_cap(POP, epsilon_max="100", delta_max="0.5", protected_unit="row", adjacency="add_remove")
        shared_reserve(led, "shared", "5.0", delta="1e-6")
        led.settle("shared", epsilon_spent="1.0")
        for i in range(8):
            shared_reserve(led, f"run-{i}", "1.0", delta="1e-6")
    results = _run_workers(_settle_release_worker, [(str(db), i) for i in range(8)])
    assert all(v == "ok" for _, v in results), results
    with Ledger(db) as led:
        assert len(led.releases("shared")) == 24 and len(led.releases()) == 48
        charges = {c.run_id: c for c in led.charges(POP)}
        assert charges["shared"].epsilon == Decimal("1.72")  # max over all concurrent releases
        for i in range(8):
            assert charges[f"run-{i}"].epsilon == Decimal(f"0.{i + 1}")
            assert charges[f"run-{i}"].status == ("failed" if i % 2 else "settled")
        assert led.spent(POP)[0] == Decimal("1.72") + sum(Decimal(f"0.{i + 1}") for i in range(8))
