"""Red team (issue 40): public outputs that differ between neighbouring datasets, beyond what DP outputs explain.

Each test builds two worlds that differ by one protected unit, runs a CI job's commands in each (``CI=true``, the
job log is public) in the same folder, and compares the public surface with the masks of
:mod:`test_public_surface`. A test here FAILS while the finding stands (it asserts the rule of docs/release.md,
"The public surface": public output is a function of public inputs and DP outputs only).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_public_surface import Masks, _contract, _diff, _read, _run, _surface, _write

from dplora.data.demo import write_tickets


def _env(world: Path) -> dict:
    return {
        "CI": "true",
        "DPLORA_LEDGER": str(world / "ledger.sqlite3"),
        "DPLORA_CACHE_DIR": str(world / "cache"),
        "DPLORA_SHOW_PRIVATE": "",
    }


def _compare(tmp_path: Path, model: Path, write_a, write_b, commands, **sections) -> list[str]:
    """Run ``commands(world, contract, env)`` (a list of ``_run`` results) on world A then B in the same folder;
    return the differences of the public surfaces."""
    world, surfaces = tmp_path / "world", []
    for name, write in (("a", write_a), ("b", write_b)):
        world.mkdir()
        cfg = _contract(world, model, write(world), **sections)
        outputs = commands(world, cfg, _env(world))
        surfaces.append(_surface(world, outputs, Masks(), {}))
        shutil.move(world, tmp_path / f"done-{name}")
    diff = _diff(*surfaces)
    print("\n".join(d[:400] for d in diff))
    return diff


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("attack-tickets") / "tickets.csv"
    write_tickets(path, num_tickets=60, seed=3, max_turns=1)
    return _read(path)


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
        return [_run(["budget", cfg, "--json"], env), _run(train, env)]

    sections = {"privacy": {"num_units": 100}, "data": {"eval_fraction": 0.02}}
    diff = _compare(
        tmp_path,
        tiny_model_dir,
        lambda w: _write(w / "data.csv", columns, a_rows),
        lambda w: _write(w / "data.csv", columns, b_rows),
        commands,
        **sections,
    )
    assert diff == []
