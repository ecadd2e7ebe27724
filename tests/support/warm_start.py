"""Helpers shared by tests/engine/test_warm_start.py and its slow tier under tests/slow/."""

from __future__ import annotations

from typer.testing import CliRunner

from dplora.data.demo import write_tickets

runner = CliRunner()


WARM = {"steps": 6, "batch_size": 4, "lr": 0.05}  # a large lr: the tiny model's adapters move visibly in 6 steps


def build_public_csv(tmp_path_factory):
    """Demo tickets from another seed: a public file with the training file's columns (never its rows)."""
    path = tmp_path_factory.mktemp("public") / "public.csv"
    write_tickets(path, num_tickets=30, seed=4242)
    return path
