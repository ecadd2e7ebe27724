"""One DP-LoRA run: contract → plan → data → engine → release. Called by ``dplora train``.

Everything that can be checked is checked before a byte is written: contract, signing key, data key,
output folder, data, plan, model, LoRA targets, per-sample gradients. The run writes into
``<output_dir>.partial`` and renames it to ``<output_dir>`` only after the last planned step, the adapters
and the signed release are written. A failed run leaves ``<output_dir>.partial`` with ``FAILED.json`` and its
metrics, never a release.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import time
import uuid
import warnings
from pathlib import Path

from dplora import data as data_mod
from dplora import release
from dplora.contract import Contract, ProtectedUnit, UnitClipping
from dplora.errors import BadInputError, DploraError, TrainingFailedError
from dplora.plan import TrainingPlan, make_plan
from dplora.record import build_record, unit_statement


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunResult:
    """What a finished run produced (seconds are wall-clock)."""

    output_dir: Path
    release_path: Path
    plan: TrainingPlan
    steps_done: int
    empty_steps: int
    epsilon_spent: float
    seconds: float
    seconds_per_step: float
    threads: int


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def plan_for(contract: Contract, unit_index: data_mod.UnitIndex | None) -> TrainingPlan:
    """Plan with N from ``privacy.num_units`` if declared (the data count is then only a check), else counted.

    Raises:
        BadInputError: the data holds more units than the contract declares.
        PlanRefusedError: see :func:`dplora.plan.make_plan`.
    """
    declared = contract.privacy.num_units
    if declared is not None:
        if unit_index is not None and unit_index.num_units > declared:
            raise BadInputError(
                f"privacy.num_units={declared} but the data holds more protected units; declare the true N"
            )
        return make_plan(contract, num_units=declared, num_units_source="contract")
    if unit_index is None:
        raise BadInputError("privacy.num_units is not declared: the data is needed to count protected units")
    return make_plan(contract, num_units=unit_index.num_units, num_units_source="data")


def _prepare_output(contract: Contract, overwrite: bool) -> tuple[Path, Path]:
    out = Path(contract.training.output_dir)
    staging = out.with_name(out.name + ".partial")
    if out.exists() and not out.is_dir():
        raise BadInputError(f"output path {out} exists and is not a folder")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise BadInputError(f"output folder {out} exists and is not empty; choose another or pass --overwrite")
    parent = out.resolve().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise BadInputError(f"cannot create output folder {out}: {parent} is not a writable folder")
    return out, staging


def _lock_output(out: Path):
    """Hold an exclusive lock on ``<output_dir>.lock`` for the run (released when the process ends).

    Raises:
        BadInputError: another run is writing to the same output folder.
    """
    import fcntl

    lock_path = out.with_name(out.name + ".lock")
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a")  # noqa: SIM115 - held open for the whole run
    except OSError as err:
        raise BadInputError(f"cannot create {lock_path}: {err.strerror}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise BadInputError(
            f"another dplora train is writing to {out}; wait for it or choose another output_dir"
        ) from None
    return handle


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _setup_model(contract: Contract, log):
    import torch
    from peft import LoraConfig, get_peft_model

    from dplora.model import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(contract.model, log)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)  # on its device BEFORE get_peft_model (cases T1)
    lora = contract.lora
    torch.manual_seed(contract.training.seed)  # the recorded seed: LoRA initialisation only
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as err:
        raise BadInputError(f"lora.target_modules={list(lora.target_modules)}: {str(err).splitlines()[0]}") from None
    torch.seed()  # everything random from here on (dropout) draws from OS entropy, not the recorded seed
    peft_model.train()
    return peft_model, tokenizer, device


def _make_optimizer(contract: Contract, params):
    import torch

    lr = contract.training.lr
    name = contract.training.optimizer.value
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


def run_training(
    contract: Contract,
    *,
    signing_key: Path | None,
    data_key: Path | None,
    overwrite: bool = False,
    ledger_path: Path | None = None,
    threads: int | None = None,
    progress: bool = True,
    tuning_trial: bool = False,
    log=print,
) -> RunResult:
    """Train DP-LoRA adapters under ``contract`` and write them with a signed release record.

    Args:
        contract: the validated contract (overrides applied).
        signing_key: Ed25519 private key PEM (else ``$DPLORA_SIGNING_KEY``).
        data_key: the data owner's HMAC key file (else ``$DPLORA_DATA_KEY``; else no data digest).
        overwrite: replace a non-empty output folder (only after the new run succeeded).
        ledger_path: SQLite budget ledger (used when ``privacy.population`` is set).
        threads: CPU threads (default: free cores).
        progress: show a rich progress bar.
        tuning_trial: charge the ledger as a hyperparameter-tuning trial (it counts like any release).
        log: one-line message sink.

    Returns:
        :class:`RunResult`.

    Raises:
        BadInputError, PlanRefusedError: before anything is written (exit 2).
        TrainingFailedError: a sanity check or a non-finite loss (exit 4); no release is written.
    """
    private_key = release.load_private_key(signing_key)
    key = release.load_data_key(data_key)
    out, staging = _prepare_output(contract, overwrite)
    table = data_mod.load_table(contract)
    unit_index = data_mod.build_unit_index(table, contract.privacy, seed=contract.training.seed)
    plan = plan_for(contract, unit_index)
    lock = _lock_output(out)
    try:
        _prepare_output(contract, overwrite)  # re-check under the lock: another run may have finished meanwhile
        return _run_locked(
            contract,
            out,
            staging,
            table,
            unit_index,
            plan,
            private_key,
            key,
            ledger_path,
            threads,
            progress,
            tuning_trial,
            log,
        )
    finally:
        Path(lock.name).unlink(missing_ok=True)
        lock.close()


def _run_locked(
    contract, out, staging, table, unit_index, plan, private_key, key, ledger_path, threads, progress, tuning_trial, log
) -> RunResult:
    """The run proper, holding the output lock: ledger check, model, privatise, loop, release."""
    for warning in plan.warnings:
        log(f"warning: {warning}")
    if contract.privacy.protected_unit is ProtectedUnit.TICKET:
        log(f"note: ticket-level DP {unit_statement(ProtectedUnit.TICKET)}")
    ledger = None
    if contract.privacy.population:
        from dplora.ledger import Ledger, default_ledger_path

        ledger = Ledger(ledger_path or default_ledger_path())
        ledger.check(contract.privacy.population, epsilon=plan.epsilon, delta=plan.delta)

    import torch

    from dplora import engine

    # Opacus hooks on a frozen base: inputs need no grad, which is expected here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
    n_threads = threads or contract.training.threads or engine.free_threads()
    torch.set_num_threads(n_threads)
    model, tokenizer, device = _setup_model(contract, log)
    log(
        f"threads: {n_threads}; N={plan.num_units} units, q={plan.sample_rate:.4g}, T={plan.steps}, "
        f"σ={plan.noise_multiplier:.4f}, ε={plan.epsilon:.4f} ({plan.accountant.value})"
    )
    examples = data_mod.tokenize_records(table, tokenizer, contract)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise BadInputError("no trainable parameters: check lora.target_modules")
    optimizer = _make_optimizer(contract, [p for _, p in named])
    gsm, dp_opt, accountant = engine.make_private(
        model, optimizer, plan=plan, unit_mean=contract.privacy.unit_clipping is UnitClipping.MEAN
    )
    engine.probe_per_sample_gradients(gsm, named)

    run_id = uuid.uuid4().hex
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    if ledger is not None:
        ledger.reserve(
            population=contract.privacy.population,
            run_id=run_id,
            epsilon=plan.epsilon,
            delta=plan.delta,
            accountant=plan.accountant.value,
            adjacency=plan.adjacency.value,
            purpose="tuning" if tuning_trial else "release",
        )
    started, t0 = _now(), time.perf_counter()
    try:
        empty = _loop(
            contract, plan, gsm, dp_opt, accountant, examples, unit_index, named, tokenizer, device, staging, progress
        )
        seconds = time.perf_counter() - t0
        if accountant.steps != plan.steps:  # never release a run that was not fully accounted
            raise TrainingFailedError(f"accounted {accountant.steps} steps, planned {plan.steps}: no release")
        epsilon_spent = plan.epsilon_at(accountant.steps)
        _write_outputs(contract, plan, gsm, staging, run_id, started, epsilon_spent, accountant.steps, key, private_key)
    except BaseException as err:
        done = accountant.steps
        spent = plan.epsilon_at(min(done + 1, plan.steps)) if plan.steps else 0.0
        reason = str(err) if isinstance(err, DploraError) else f"{err.__class__.__name__}"
        _write_json(
            staging / "FAILED.json",
            {
                "run_id": run_id,
                "steps_done": done,
                "steps_planned": plan.steps,
                "epsilon_charged_upper_bound": spent,
                "reason": reason,
                "time": _now(),
                "release": "none (run failed)",
            },
        )
        (staging / release.RELEASE_FILENAME).unlink(missing_ok=True)
        if ledger is not None:
            ledger.settle(run_id, epsilon_spent=spent, status="failed")
        if isinstance(err, DploraError | KeyboardInterrupt):
            raise
        raise TrainingFailedError(f"training failed at step {done}: {err.__class__.__name__}") from err
    if out.exists():
        old = out.with_name(out.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
        staging.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(out)
    if ledger is not None:
        ledger.settle(run_id, epsilon_spent=epsilon_spent, status="settled")
        ledger.record_release(
            run_id=run_id,
            record_sha256=release.sha256_file(out / release.RELEASE_FILENAME),
            epsilon=epsilon_spent,
            delta=plan.delta,
            label="final",
        )
    return RunResult(
        output_dir=out,
        release_path=out / release.RELEASE_FILENAME,
        plan=plan,
        steps_done=accountant.steps,
        empty_steps=empty,
        epsilon_spent=epsilon_spent,
        seconds=seconds,
        seconds_per_step=seconds / max(plan.steps, 1),
        threads=n_threads,
    )


def _write_outputs(contract, plan, gsm, staging, run_id, started, epsilon_spent, steps_done, key, private_key):
    """Save the adapters and the resolved contract, then sign the release over them (inside ``staging``)."""
    staging = staging.resolve()
    adapter_dir = staging / "adapter"
    gsm._module.save_pretrained(adapter_dir)
    (adapter_dir / "README.md").unlink(missing_ok=True)  # peft's generated card names the local base-model path
    config_path = adapter_dir / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config["base_model_name_or_path"] = contract.model.name or Path(contract.model.path).name
    config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    (staging / "contract.yaml").write_text(contract.to_yaml())
    artifacts = sorted(p for p in adapter_dir.rglob("*") if p.is_file()) + [staging / "contract.yaml"]
    record = build_record(
        contract=contract,
        plan=plan,
        run_id=run_id,
        steps_done=steps_done,
        epsilon_spent=epsilon_spent,
        started_at=started,
        finished_at=_now(),
        data_digest=release.data_digest_entry([Path(contract.data.path)], key),
        artifacts=[p.relative_to(staging).as_posix() for p in artifacts],
    )
    release.write_release(output_dir=staging, record=record, artifact_files=artifacts, private_key=private_key)


def _loop(
    contract, plan, gsm, dp_opt, accountant, examples, unit_index, named, tokenizer, device, staging, progress
) -> int:
    """Run exactly plan.steps logical steps; returns the number of empty Poisson batches."""
    import numpy as np
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from dplora import engine

    # Each unit present in the data joins with probability q = B/N (N declared or counted).
    sampler = data_mod.PoissonUnitSampler(unit_index.num_units, plan.sample_rate)
    physical = contract.training.physical_batch_size
    before = {n: p.detach().clone() for n, p in named}
    empty = 0
    metrics = (staging / "metrics.jsonl").open("w")
    metrics.write(
        json.dumps(
            {
                "note": "fields under not_covered_by_dp are computed on private data and are not "
                "covered by ε; they never enter the release record"
            }
        )
        + "\n"
    )
    columns = [
        TextColumn("[bold]DP-LoRA"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, disable=not progress, transient=False) as bar, metrics:
        task = bar.add_task("train", total=plan.steps, info="")
        for step in range(1, plan.steps + 1):
            eps_next = plan.epsilon_at(step)  # raises beyond T: the budget stop
            if eps_next > plan.target_epsilon:
                raise TrainingFailedError(f"step {step} would spend ε={eps_next:.4f} > target")
            t_step = time.perf_counter()
            units = sampler.sample()
            rows = [r for u in units for r in unit_index.records_of_unit[u]]
            local = (
                np.concatenate([np.full(len(unit_index.records_of_unit[u]), i) for i, u in enumerate(units)])
                if len(units)
                else np.zeros(0, dtype=int)
            )
            dp_opt.begin_logical_step(len(units))
            loss_sum = 0.0
            for start in range(0, len(rows), physical):
                chunk = rows[start : start + physical]
                batch = {
                    k: v.to(device)
                    for k, v in engine.collate([examples[r] for r in chunk], tokenizer.pad_token_id).items()
                }
                losses = engine.per_sequence_loss(gsm, batch)
                value = float(losses.detach().sum())
                engine.check_finite(value, step)
                losses.sum().backward()
                dp_opt.accumulate(torch.as_tensor(local[start : start + physical], dtype=torch.long))
                loss_sum += value
            if not rows:
                empty += 1
            dp_opt.step()
            dp_opt.zero_grad(set_to_none=True)
            if step == 1:
                engine.check_all_moved(before, named)
                del before
            for _, p in named:
                if not torch.isfinite(p).all():
                    raise TrainingFailedError(f"non-finite parameter after step {step}")
            mean_loss = loss_sum / len(rows) if rows else None
            info = f"ε≤{eps_next:.3f}  loss {mean_loss:.3f}" if mean_loss is not None else f"ε≤{eps_next:.3f}"
            bar.update(task, advance=1, info=info)
            metrics.write(
                json.dumps(
                    {
                        "step": step,
                        "epsilon_upper": eps_next,
                        "seconds": round(time.perf_counter() - t_step, 3),
                        "not_covered_by_dp": {
                            "train_loss": mean_loss,
                            "units": len(units),
                            "records": len(rows),
                        },
                    }
                )
                + "\n"
            )
            metrics.flush()
    return empty
