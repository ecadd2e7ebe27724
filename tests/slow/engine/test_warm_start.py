"""The slow tier of tests/engine/test_warm_start.py, whose docstring describes the module."""

from __future__ import annotations

import builtins
import hashlib
import json
from pathlib import Path

import pytest
import torch
from conftest import contract_dict, release_statement, train_tiny, write_contract
from support.warm_start import WARM, build_public_csv, runner
from support.warm_start_resume import count_warm_starts, sigterm_after_step

from dplora.cli.app import app
from dplora.data import readers
from dplora.data.public import public_data
from dplora.engine import warmstart
from dplora.mechanism import noise as noise_mod
from dplora.mechanism import optimizer as dpopt
from dplora.run import checkpoint

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


@pytest.fixture(scope="module")
def public_csv(tmp_path_factory) -> Path:
    return build_public_csv(tmp_path_factory)


def _lora(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_a_warm_started_run_fits_the_public_file_first_and_charges_nothing_for_it(
    tmp_path, tiny_model_dir, tickets_csv, public_csv, signing_key, monkeypatch
):
    """One DP run with the warm start (spied), one without: the adapters, the reads, the event order, ε, the record,
    verify and the card."""
    events: list[str] = []
    captured: dict = {}
    real_warm = warmstart.warm_start
    real_normal = noise_mod.CsprngGaussian.normal
    real_account = dpopt.StepAccountant.step

    def spy_warm(public, training, model, tokenizer, *, log=print):
        captured["public"] = public
        opened: list[str] = []
        real_open, real_read = builtins.open, readers.read_table

        def spy_open(file, *args, **kw):
            opened.append(str(file))
            return real_open(file, *args, **kw)

        def spy_read(path, builder):
            opened.append(str(path))
            return real_read(path, builder)

        captured["init"] = _lora(model)
        monkeypatch.setattr(builtins, "open", spy_open)
        monkeypatch.setattr(readers, "read_table", spy_read)
        try:
            entry = real_warm(public, training, model, tokenizer, log=log)
        finally:
            monkeypatch.setattr(builtins, "open", real_open)
            monkeypatch.setattr(readers, "read_table", real_read)
        captured["after"], captured["opened"] = _lora(model), opened
        events.append("warm")
        return entry

    def spy_normal(self, size, std, *, device="cpu"):
        events.append("noise")
        return real_normal(self, size, std, device=device)

    def spy_account(self, optimizer):
        events.append("account")
        return real_account(self, optimizer)

    monkeypatch.setattr(warmstart, "warm_start", spy_warm)
    monkeypatch.setattr(noise_mod.CsprngGaussian, "normal", spy_normal)
    monkeypatch.setattr(dpopt.StepAccountant, "step", spy_account)
    data = {"public_warm_start": {"path": str(public_csv), **WARM}}
    lora = {"dropout": 0.1}  # LoRA dropout draws during the warm start: seeded there too
    result, out = train_tiny(
        tmp_path, tiny_model_dir, tickets_csv, signing_key, data=data, lora=lora, training={"seed": 7}
    )
    assert result.exit_code == 0, result.output
    assert "public warm start: 6 steps of 4 records from public.csv" in result.output

    # the DP phase: one noise draw and one accountant step per logical step (T = 3), every one after the warm start
    assert events == ["warm"] + ["noise", "account"] * 3
    # the warm start was handed the public file's section only, read the public file and never the private one
    assert str(tickets_csv) not in captured["public"].model_dump_json()
    opened = [Path(p).resolve() for p in captured["opened"]]
    assert public_csv.resolve() in opened and tickets_csv.resolve() not in opened

    # the adapters after the warm start: moved from peft's init, and equal to a direct call under the same seed
    init, after = captured["init"], captured["after"]
    assert init.keys() == after.keys() and len(init) == 8
    assert any(not torch.equal(init[k], after[k]) for k in init)
    from dplora.contract.loader import parse_contract
    from dplora.engine.lora import setup_model

    contract = parse_contract(yaml_load(tmp_path / "run.yaml"))
    fresh, tokenizer = setup_model(contract.model, contract.lora, contract.training, "cpu", "fp32", False, print)
    assert all(torch.equal(v, init[k]) for k, v in _lora(fresh).items())  # the same seeded init
    public = public_data(contract.data)
    assert public.path == str(public_csv) and str(tickets_csv) not in public.model_dump_json()
    entry = real_warm(public, contract.training, fresh, tokenizer, log=lambda *_: None)
    assert all(torch.equal(v, after[k]) for k, v in _lora(fresh).items())
    other = contract.training.model_copy(update={"seed": 8})  # another seed: another batch order and dropout
    fresh8, _ = setup_model(contract.model, contract.lora, contract.training, "cpu", "fp32", False, print)
    real_warm(public, other, fresh8, tokenizer, log=lambda *_: None)
    assert any(not torch.equal(v, after[k]) for k, v in _lora(fresh8).items())

    # the record: the public file by name and sha256 (never the machine's path) and the settings; nothing charged
    record = release_statement(out)["predicate"]
    warm = record["public_warm_start"]
    assert warm == {k: v for k, v in entry.items() if k != "path"} and "path" not in warm
    assert str(tmp_path) not in json.dumps(record)  # no path of the training machine anywhere in the record
    assert warm["sha256"] == hashlib.sha256(public_csv.read_bytes()).hexdigest()
    assert (warm["file"], warm["records"]) == ("public.csv", 30)
    assert (warm["steps"], warm["batch_size"], warm["lr"], warm["epsilon_charged"]) == (6, 4, 0.05, 0)

    # ε spent, σ, q and T equal the same run without the warm start
    monkeypatch.undo()
    plain, plain_out = train_tiny(
        tmp_path, tiny_model_dir, tickets_csv, signing_key, name="plain", lora=lora, training={"seed": 7}
    )
    assert plain.exit_code == 0, plain.output
    plain_record = release_statement(plain_out)["predicate"]
    assert "public_warm_start" not in plain_record and "public warm start" not in plain.output
    assert record["accounting"] == plain_record["accounting"]
    assert record["mechanism"] == plain_record["mechanism"]

    # verify prints it (and --json claims it); the card states it; a plain release says nothing of it
    shown = runner.invoke(app, ["verify", str(out), "--public-key", str(signing_key[1])])
    assert shown.exit_code == 0, shown.output
    line = next(ln for ln in shown.output.splitlines() if ln.startswith("public warm start: "))
    assert "public.csv" in line and str(public_csv) not in line and warm["sha256"] in line
    assert "6 steps of 4 records at lr 0.05" in line
    as_json = runner.invoke(app, ["verify", str(out), "--public-key", str(signing_key[1]), "--json"])
    assert json.loads(as_json.output)["claims"]["public_warm_start"]["sha256"] == warm["sha256"]
    card = (out / "adapter" / "README.md").read_text()
    assert f"`public.csv` (sha256 `{warm['sha256']}`, 30 records)" in card and str(public_csv) not in card
    assert "declaring private data public voids the guarantee" in card
    plain_shown = runner.invoke(app, ["verify", str(plain_out), "--public-key", str(signing_key[1]), "--json"])
    assert "public_warm_start" not in json.loads(plain_shown.output)["claims"]
    assert "warm-start" not in (plain_out / "adapter" / "README.md").read_text()


def yaml_load(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def test_resume_does_not_run_the_warm_start_again(
    tmp_path, tiny_model_dir, tickets_csv, public_csv, signing_key, monkeypatch
):
    """SIGTERM after step 2 (a checkpoint there), then --resume: no second warm start, the record keeps the
    entry the first attempt computed (the checkpoint carries it)."""
    calls = count_warm_starts(monkeypatch)
    hook = sigterm_after_step(2)
    data = {"public_warm_start": {"path": str(public_csv), **WARM}}
    raw = contract_dict(tiny_model_dir, tickets_csv, tmp_path / "run", data=data, training={"steps": 4})
    cfg = write_contract(tmp_path / "run.yaml", raw)
    args = ["train", str(cfg), "--signing-key", str(signing_key[0]), "--no-progress"]
    with checkpoint.fault_hook(hook):
        first = runner.invoke(app, args)
    assert first.exit_code == 130, first.output
    assert calls == ["warm"]
    info = checkpoint.read_info(tmp_path / "run.partial")
    assert info.step == 2 and info.meta["warm_start"]["sha256"] == hashlib.sha256(public_csv.read_bytes()).hexdigest()
    second = runner.invoke(app, [*args, "--resume"])
    assert second.exit_code == 0, second.output
    assert calls == ["warm"] and "public warm start" not in second.output
    # the record names the file by name and sha256, never by the training machine's path (the checkpoint keeps it)
    meta = {k: v for k, v in info.meta["warm_start"].items() if k != "path"}
    assert release_statement(tmp_path / "run")["predicate"]["public_warm_start"] == meta
