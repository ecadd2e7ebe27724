"""The slow tier of tests/engine/test_engine.py, whose docstring describes the module."""

from __future__ import annotations

import json

import pytest
from support.row_contract import contract_raw
from tiny import save_tiny_model

from dplora.contract.loader import parse_contract
from dplora.engine import batch as batching
from dplora.mechanism import optimizer as dpopt
from dplora.recipe.config import RunOptions
from dplora.recipe.train import run_training
from dplora.release import envelope as release
from dplora.release import keys as release_keys

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture()
def signing_key(tmp_path, monkeypatch):
    monkeypatch.delenv(release.DATA_KEY_ENV, raising=False)
    return release_keys.generate_keypair(tmp_path / "keys" / "signing.pem")[0]


def _contract(tmp_path, model_dir, *, rows: int, privacy: dict, training: dict):
    return parse_contract(contract_raw(tmp_path, model_dir, rows=rows, privacy=privacy, training=training))


def test_run_training_steps_accountant_on_empty_batches(tmp_path, tiny_model_dir, signing_key, monkeypatch):
    """T5: q=0.001 over 10 rows: every step accounted, empty steps move params, no forward of B=0."""
    contract = _contract(
        tmp_path,
        tiny_model_dir,
        rows=10,
        privacy={"num_units": 1000},
        training={"expected_batch_size": 1, "steps": 8},
    )
    spy = {"units": [], "moved": [], "batch_sizes": []}
    real_make_private, real_loss = dpopt.make_private, batching.per_sequence_loss

    def make_private_spy(model, optimizer, **kw):
        gsm, dp_opt, accountant = real_make_private(model, optimizer, **kw)
        begin, step = dp_opt.begin_logical_step, dp_opt.step

        def begin_spy(num_units):
            if spy.get("training"):  # the setup probes (memory, time estimate) also begin synthetic steps
                spy["units"].append(num_units)
            return begin(num_units)

        def step_spy(*args, **kwargs):
            before = [p.detach().clone() for p in dp_opt.params]
            out = step(*args, **kwargs)
            spy["moved"].append(
                min(float((p.detach() - b).abs().max()) for p, b in zip(dp_opt.params, before, strict=True))
            )
            return out

        dp_opt.begin_logical_step, dp_opt.step = begin_spy, step_spy
        spy["accountant"] = accountant
        return gsm, dp_opt, accountant

    def loss_spy(model, batch):
        spy["batch_sizes" if spy.get("training") else "setup_sizes"].append(int(batch["input_ids"].shape[0]))
        return real_loss(model, batch)

    from dplora.run import checkpoint

    def loop_start(point, _step):
        if point == "loop-start":  # the set-up (probes, per-example check) is over
            spy["training"] = True

    spy["setup_sizes"] = []
    monkeypatch.setattr(dpopt, "make_private", make_private_spy)
    monkeypatch.setattr(batching, "per_sequence_loss", loss_spy)
    with checkpoint.fault_hook(loop_start):
        result = run_training(
            contract, RunOptions(signing_key=signing_key, data_key=None, progress=False, threads=1), log=lambda *_: None
        )
    plan = result.plan
    assert plan.sample_rate == pytest.approx(0.001) and plan.steps == 8
    assert result.steps_done == spy["accountant"].steps == 8
    assert spy["accountant"].history == [(1.0, 0.001, 8)]
    assert len(spy["units"]) == 8 and result.empty_steps == spy["units"].count(0) >= 1
    assert len(spy["moved"]) == 8 and all(m > 0 for m in spy["moved"])  # noise on empty steps too
    # setup (probes and the per-example check) ran synthetic batches only, never a batch of 0 records
    assert spy["setup_sizes"] and all(b > 0 for b in spy["setup_sizes"])
    assert all(b > 0 for b in spy["batch_sizes"])
    assert len(spy["batch_sizes"]) == sum(1 for u in spy["units"] if u)  # one forward per non-empty step
    lines = [
        json.loads(line)
        for line in (result.output_dir.with_name(result.output_dir.name + ".private") / "metrics.jsonl")
        .read_text()
        .splitlines()
    ]
    assert [m["not_covered_by_dp"]["units"] for m in lines[1:]] == spy["units"]
    assert result.release_path.is_file()


def test_non_finite_losses_are_zero_contributions_not_a_failure(tmp_path, tiny_model_dir, signing_key, monkeypatch):
    """T7 under issue 41.4: NaN losses in every training forward no longer stop the run (whether such a record is
    in the data would decide a public exit code); each such record contributes zero, the noise still moves every
    LoRA tensor, the run releases at T, and the zeroed records are counted in the private report only."""
    contract = _contract(tmp_path, tiny_model_dir, rows=4, privacy={}, training={"expected_batch_size": 4, "steps": 2})
    from dplora.run import checkpoint

    real_loss, calls, training = batching.per_sequence_loss, [], []

    def nan_in_training(model, batch):  # the setup probes and the per-example check see finite losses
        if not training:
            return real_loss(model, batch)
        calls.append(batch["input_ids"].shape[0])
        return real_loss(model, batch) * float("nan")

    def loop_start(point, _step):
        if point == "loop-start":
            training.append(True)

    monkeypatch.setattr(batching, "per_sequence_loss", nan_in_training)
    with checkpoint.fault_hook(loop_start):
        result = run_training(
            contract, RunOptions(signing_key=signing_key, data_key=None, progress=False, threads=1), log=print
        )
    assert result.release_path.is_file() and result.steps_done == 2
    report = json.loads((tmp_path / "run.private" / "report.json").read_text())
    assert calls and report["records_zeroed"] == sum(calls)  # every training record, nothing else
