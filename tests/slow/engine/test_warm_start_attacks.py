"""Attacks on the public warm start (``data.public_warm_start``) end to end, with ``training.optimizer: dp_adambc``,
``lora.freeze_a`` (FFA-LoRA) and resume.

``test_finding_*`` holds the fix in :func:`dplora.data.readers.read_table` (a file name read as an fsspec pattern
loaded the private file instead of the public one; see tests/engine/test_warm_start_attacks.py). Each
``test_held_*`` is an attack the code withstood, kept as a regression. References are independent of the code under
test: the private file carries a canary string in every record, spies sit on the readers, the noise source, the
accountant and the optimizer, and the expected Φ is recomputed from the signed record.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from conftest import contract_dict, release_statement, train_tiny, write_contract
from safetensors.torch import load_file
from support.warm_start_attacks import CANARY, PUBLIC_TICKETS, WARM, decoded_texts, glob_public, write_private
from support.warm_start_resume import count_warm_starts, sigterm_after_step
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.data.demo import write_tickets
from dplora.engine import warmstart
from dplora.mechanism import adambc
from dplora.mechanism import noise as noise_mod
from dplora.mechanism import optimizer as dpopt
from dplora.run import checkpoint

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


runner = CliRunner()


def test_finding_end_to_end_the_warm_start_trains_on_the_public_file_only(
    tmp_path, tiny_model_dir, signing_key, monkeypatch
):
    """``dplora train`` with ``public_warm_start.path: <dir>/[t]ickets.csv`` beside the private ``<dir>/tickets.csv``:
    the noise-free fit must see public records only, and the signed record's ``records`` must be the public count
    (before the fix: 40, the private file's record count, and every fitted record carried the canary)."""
    private = write_private(tmp_path / "tickets.csv")
    public = glob_public(tmp_path, "[t]ickets.csv")
    fitted: list[list] = []
    real_fit = warmstart.fit

    def spy_fit(model, examples, **kw):
        fitted.append(list(examples))
        return real_fit(model, examples, **kw)

    monkeypatch.setattr(warmstart, "fit", spy_fit)
    data = {"public_warm_start": {"path": str(public), **WARM}}
    result, out = train_tiny(tmp_path, tiny_model_dir, private, signing_key, data=data)
    assert result.exit_code == 0, result.output
    (examples,) = fitted
    assert not any(CANARY in t for t in decoded_texts(examples)), "noise-free steps on private records, charged nothing"
    warm = release_statement(out)["predicate"]["public_warm_start"]
    assert warm["records"] == PUBLIC_TICKETS and warm["sha256"] == hashlib.sha256(public.read_bytes()).hexdigest()


def _combo_run(tmp_path, tiny_model_dir, private, signing_key, public, monkeypatch, name):
    """warm start + freeze_a + dp_adambc with E = 1 (empty steps likely): events, noise, samples, Φ, the release."""
    events: list[str] = []
    sizes: list[int] = []
    firsts: list[torch.Tensor] = []
    phis: list[float] = []
    samples: list[np.ndarray] = []
    real_normal, real_account = noise_mod.CsprngGaussian.normal, dpopt.StepAccountant.step
    real_warm = warmstart.warm_start
    from dplora.mechanism import sampling

    real_sample = sampling.PoissonUnitSampler.sample

    def spy_normal(self, size, std, *, device="cpu"):
        events.append("noise")
        sizes.append(int(size))
        out = real_normal(self, size, std, device=device)
        firsts.append(out.reshape(-1)[:8].clone())
        return out

    def spy_account(self, optimizer):
        events.append("account")
        return real_account(self, optimizer)

    def spy_warm(*args, **kw):
        events.append("warm")
        return real_warm(*args, **kw)

    def spy_sample(self):
        got = real_sample(self)
        samples.append(got.copy())
        return got

    class Spy(adambc.DPAdamBC):
        def __init__(self, params, **kw):
            phis.append(kw["noise_variance"])
            super().__init__(params, **kw)

    with monkeypatch.context() as mp:
        mp.setattr(noise_mod.CsprngGaussian, "normal", spy_normal)
        mp.setattr(dpopt.StepAccountant, "step", spy_account)
        mp.setattr(warmstart, "warm_start", spy_warm)
        mp.setattr(sampling.PoissonUnitSampler, "sample", spy_sample)
        mp.setattr(adambc, "DPAdamBC", Spy)
        result, out = train_tiny(
            tmp_path,
            tiny_model_dir,
            private,
            signing_key,
            name=name,
            data={"public_warm_start": {"path": str(public), **WARM}},
            lora={"freeze_a": True},
            training={"optimizer": "dp_adambc", "expected_batch_size": 1, "steps": 4, "seed": 7},
        )
    assert result.exit_code == 0, result.output
    return result, out, {"events": events, "sizes": sizes, "firsts": firsts, "phis": phis, "samples": samples}


def test_held_warm_start_with_freeze_a_and_dp_adambc_keeps_every_invariant(
    tmp_path, tiny_model_dir, signing_key, monkeypatch
):
    """The three new paths together, twice with the same seed and public file but different private files: one
    noise draw per logical step, of B's size only, each followed by its accountant step, all after the warm start
    (empty batches included); A is bit-equal to its seeded init (neither the warm start nor DP moved it); Φ is the
    signed plan's (σC/E)²; noise and sampling differ between the runs (OS entropy, not the seed the warm start
    uses); the warm-start entry and its log line are the same for both (no private value in them); ε = the plan's."""
    public = glob_public(tmp_path, "public.csv")
    priv_a = write_private(tmp_path / "a.csv", rows=40)
    priv_b = write_private(tmp_path / "b.csv", rows=40)
    priv_b.write_text(priv_b.read_text().replace("charged twice", "never delivered"))  # same N, other records
    res_a, out_a, got_a = _combo_run(tmp_path, tiny_model_dir, priv_a, signing_key, public, monkeypatch, "ra")
    res_b, out_b, got_b = _combo_run(tmp_path, tiny_model_dir, priv_b, signing_key, public, monkeypatch, "rb")
    adapter = load_file(out_a / "adapter" / "adapter_model.safetensors")
    b_count = sum(v.numel() for k, v in adapter.items() if "lora_B" in k)
    for got, out in ((got_a, out_a), (got_b, out_b)):
        assert got["events"] == ["warm"] + ["noise", "account"] * 4
        assert got["sizes"] == [b_count] * 4  # A frozen: no coordinate of A is noised
        assert len(got["samples"]) == 4
        record = release_statement(out)["predicate"]
        mech = record["mechanism"]
        phi = (mech["noise_std"] / mech["normalizer"]["expected_units_per_step"]) ** 2
        assert got["phis"] == [pytest.approx(phi, rel=1e-12)] and mech["normalizer"]["expected_units_per_step"] == 1
        assert record["lora"]["freeze_a"] is True
        assert record["accounting"]["epsilon_spent"] <= record["accounting"]["target_epsilon"]
    assert not torch.equal(got_a["firsts"][0], got_b["firsts"][0])  # fresh key per run, not training.seed
    flat_a, flat_b = (np.concatenate([np.append(s, -1) for s in g["samples"]]) for g in (got_a, got_b))
    everything_empty = all(len(s) == 0 for s in got_a["samples"] + got_b["samples"])  # p ≈ 0.36⁸: inconclusive
    assert everything_empty or not np.array_equal(flat_a, flat_b)  # Poisson masks are not a function of the seed
    # A: the warm start and DP both left it at peft's seeded init (same seed, so equal across the two runs too)
    other = load_file(out_b / "adapter" / "adapter_model.safetensors")
    for k, v in adapter.items():
        if "lora_A" in k:
            assert torch.equal(v, other[k]), k
        else:
            assert not torch.equal(v, other[k]), k  # B: differs (noise and sampling are not seeded)
    warm_a = release_statement(out_a)["predicate"]["public_warm_start"]
    warm_b = release_statement(out_b)["predicate"]["public_warm_start"]
    assert warm_a == warm_b and warm_a["records"] == PUBLIC_TICKETS
    line = [ln for ln in res_a.output.splitlines() if ln.startswith("public warm start:")]
    assert line == [ln for ln in res_b.output.splitlines() if ln.startswith("public warm start:")] and len(line) == 1


def test_held_resume_keeps_the_entry_of_the_weights_it_restores(tmp_path, tiny_model_dir, signing_key, monkeypatch):
    """SIGTERM after step 2; the public file is then EDITED: --resume runs no second warm start and the record keeps
    the sha256 the restored adapters were fitted on (not the file's new one). Dropping the warm start from the
    contract before resuming is refused (a changed contract), so the record never loses the entry either."""
    private = write_private(tmp_path / "tickets.csv", rows=40)
    public = glob_public(tmp_path, "public.csv")
    original = hashlib.sha256(public.read_bytes()).hexdigest()
    calls = count_warm_starts(monkeypatch)
    data = {"public_warm_start": {"path": str(public), **WARM}}
    raw = contract_dict(tiny_model_dir, private, tmp_path / "run", data=data, training={"steps": 4})
    cfg = write_contract(tmp_path / "run.yaml", raw)
    args = ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"]
    with checkpoint.fault_hook(sigterm_after_step(2)):
        assert runner.invoke(app, args).exit_code == 130
    write_tickets(public, num_tickets=PUBLIC_TICKETS + 5, seed=99, overwrite=True)  # the file changes meanwhile
    raw_without = contract_dict(tiny_model_dir, private, tmp_path / "run", training={"steps": 4})
    dropped = runner.invoke(
        app, ["train", str(write_contract(tmp_path / "plain.yaml", raw_without)), *args[2:], "--resume"]
    )
    assert dropped.exit_code == 2 and "the contract changed since the checkpoint" in dropped.output, dropped.output
    resumed = runner.invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert calls == ["warm"]
    warm = release_statement(tmp_path / "run")["predicate"]["public_warm_start"]
    assert warm["sha256"] == original and warm["records"] == PUBLIC_TICKETS
