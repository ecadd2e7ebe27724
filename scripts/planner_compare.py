"""The planner's choice against the demo contract's hand settings, at the same compute and ε (issue 29).

Rows, all through dplora's own training path (:func:`dplora.recipe.train.run_training`):

- ``base``: the base model, no training (the floor);
- ``control``: the non-private control (``privacy.enabled: false``) with the hand settings;
- ``hand``: the demo contract's settings (B = 32, lr = 0.002, constant schedule), T = ceil(E·N/32);
- ``planner``: ``training.expected_batch_size: auto`` and ``steps: auto`` with the same epochs E (the same
  compute in units processed): B, T, lr and schedule from :mod:`dplora.plan.planner`.

Each DP row is trained ``--repeats`` times (the noise and sampling draw from OS entropy, so repeats differ); the
report gives held-out loss per target token (mean and standard deviation over repeats) and the share of the
control's gain, (base − row) / (base − control).

Real mode: the packaged SmolLM2-135M and Bitext read from ``../shared/data`` (10 % of the rows held out by a
seeded hash; 200 of them scored), instruction → response pairs, ε = 8, δ = 1e-6, PRV. The default size (N = 3,200
rows, E = 1, 48 tokens) is the smallest at which the planner has a choice (B = 48 and 64 reach T ≥ 50) and the
hand row runs T = 100: about 30 core-minutes per DP run at one thread, so ``--jobs 2`` on 2 cores takes about
1 h 45 min for 3 repeats (docs/planner.md has the measured run):

    .venv/bin/python scripts/planner_compare.py --out bench-planner --repeats 3 --jobs 2

``--toy``: a tiny random Llama and generated demo tickets, RDP, a few seconds per run (a test runs it).
Output: ``DIR/planner_compare.json`` and ``DIR/planner_compare.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

HAND = {"expected_batch_size": 32, "lr": 0.002}  # configs/demo.yaml


def _quiet(message: str) -> None:
    pass


def _contract(setup: dict, out: Path, *, arm: str, enabled: bool = True) -> dict:
    training = {
        "physical_batch_size": setup["physical"],
        "max_seq_len": setup["max_seq_len"],
        "seed": 0,
        "output_dir": str(out),
        "threads": setup["threads"],
        "epochs": setup["epochs"],
    }
    if arm == "planner":
        training |= {"expected_batch_size": "auto", "steps": "auto", "lr": HAND["lr"]}
    else:
        training |= {"expected_batch_size": HAND["expected_batch_size"], "lr": HAND["lr"]}
    return {
        "privacy": {
            "protected_unit": "row",
            "adjacency": "add_remove",
            "target_epsilon": setup["epsilon"],
            "delta": setup["delta"],
            "accountant": setup["accountant"],
            "max_grad_norm": 1.0,
            "num_units": setup["num_units"],
            "enabled": enabled,
        },
        "model": setup["model"],
        "data": {"path": str(setup["train"]), **setup["columns"]},
        "lora": {"r": setup["r"], "alpha": 2.0 * setup["r"], "target_modules": ["q_proj", "v_proj"]},
        "training": training,
    }


def _train(raw: dict, key: Path) -> dict:
    from dplora.contract.loader import parse_contract
    from dplora.recipe.config import RunOptions
    from dplora.recipe.train import run_training

    result = run_training(
        parse_contract(raw), RunOptions(signing_key=key, data_key=None, overwrite=True, progress=False), log=_quiet
    )
    p = result.plan
    return {
        "B": p.expected_batch_size,
        "T": p.steps,
        "q": p.sample_rate,
        "sigma": p.noise_multiplier,
        "sigma_over_B": p.noise_multiplier / p.expected_batch_size if p.noise_multiplier else 0.0,
        "lr": p.lr,
        "lr_schedule": p.lr_schedule,
        "epsilon_spent": result.epsilon_spent if result.differentially_private else None,
        "folder": str(result.output_dir),
    }


def _held_out_loss(setup: dict, folder: str | None) -> float:
    """Held-out loss per target token of the base model (``folder`` None) or a run's adapters."""
    import datasets

    from dplora.contract.loader import parse_contract
    from dplora.contract.spec import ModelSection
    from dplora.data.tokens import tokenize_records
    from dplora.engine.model import load_model_and_tokenizer
    from dplora.evaluate.heldout import record_nll

    model, tokenizer = load_model_and_tokenizer(ModelSection(**setup["model"]), _quiet)
    model.eval()
    if folder is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, Path(folder) / "adapter", is_trainable=False).eval()
    contract = parse_contract(_contract(setup, Path(tempfile.gettempdir()) / "unused", arm="hand"))
    examples = tokenize_records(
        datasets.Dataset.from_list(setup["held"]), tokenizer, contract.data, max_seq_len=contract.training.max_seq_len
    )
    nll, tokens = record_nll(model, examples, pad_id=tokenizer.pad_token_id, device="cpu", batch_size=32)
    return math.fsum(nll) / sum(tokens)


def _toy_setup(tmp: Path, threads: int) -> dict:
    from tiny import save_tiny_model
    from utility_bench import _held_out, _read_csv, _write_csv

    from dplora.data.demo import write_tickets

    model_dir = save_tiny_model(tmp / "tiny-model")
    write_tickets(tmp / "all.csv", num_tickets=240, seed=3)
    rows = _read_csv(tmp / "all.csv")
    held = [r for i, r in enumerate(rows) if _held_out(i, 0, 0.15)]
    train = [r for i, r in enumerate(rows) if not _held_out(i, 0, 0.15)]
    path = _write_csv(tmp / "train.csv", train, list(rows[0]))
    return {
        "model": {"path": str(model_dir)},
        "train": path,
        "held": [{"message": r["message"], "reply": r["reply"]} for r in held],
        "columns": {"prompt_column": "message", "response_column": "reply"},
        "num_units": len(train),  # generated, public data: its row count may be declared
        "epochs": 8.0,
        "epsilon": 8.0,
        "delta": 1e-5,
        "accountant": "rdp",
        "physical": 16,
        "max_seq_len": 32,
        "r": 2,
        "threads": threads,
    }


def _real_setup(tmp: Path, threads: int, epochs: float, rows: int | None, max_seq_len: int) -> dict:
    """Bitext as prompt → response pairs (instruction, response), the first ``rows`` training rows (public data:
    N is their count). Pairs rather than conversations: through SmolLM2's chat template the system prompt and the
    markup take about 30 of the tokens, so at the short ``max_seq_len`` a CPU affords almost no reply would be left."""
    from utility_bench import BITEXT, _held_out, _read_csv

    table = _read_csv(BITEXT)
    pairs = [{"prompt": r["instruction"], "response": r["response"].replace("\r\n", "\n")} for r in table]
    held = [p for i, p in enumerate(pairs) if _held_out(i, 0, 0.1)][:200]
    train = [p for i, p in enumerate(pairs) if not _held_out(i, 0, 0.1)][:rows]
    path = tmp / "bitext_train.jsonl"
    path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in train), encoding="utf-8")
    return {
        "model": {"name": "smollm2-135m"},
        "train": path,
        "held": held,
        "columns": {"prompt_column": "prompt", "response_column": "response"},
        "num_units": len(train),  # rows of a public dataset
        "epochs": epochs,
        "epsilon": 8.0,
        "delta": 1e-6,
        "accountant": "prv",
        "physical": 16,
        "max_seq_len": max_seq_len,
        "r": 8,
        "threads": threads,
    }


def _job(setup: dict, out: Path, key: Path, name: str) -> tuple[str, dict]:
    """One row of the table: ``base`` (score only), ``control`` or ``ARM-i`` (train, then score)."""
    import torch

    torch.set_num_threads(setup["threads"])
    if name == "base":
        return name, {"loss": _held_out_loss(setup, None)}
    arm = name.split("-")[0]
    enabled = arm != "control"
    run = _train(_contract(setup, out / name, arm="hand" if arm == "control" else arm, enabled=enabled), key)
    run["loss"] = _held_out_loss(setup, run["folder"])
    return name, run


def compare(setup: dict, out: Path, key: Path, repeats: int, jobs: int = 1) -> dict:
    """Train and score every row (``jobs`` processes at once, each at ``setup["threads"]``); returns the report."""
    names = ["base", "control"] + [f"{arm}-{i}" for i in range(repeats) for arm in ("planner", "hand")]
    if jobs <= 1:
        done = dict(_job(setup, out, key, n) for n in names)
    else:
        import concurrent.futures
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            n = len(names)
            done = dict(pool.map(_job, [setup] * n, [out] * n, [key] * n, names))
    base, control = done["base"]["loss"], done["control"]
    arms = {}
    for arm in ("hand", "planner"):
        runs = [done[f"{arm}-{i}"] for i in range(repeats)]
        losses = [r["loss"] for r in runs]
        gain = base - control["loss"]
        arms[arm] = {
            "settings": {k: runs[0][k] for k in ("B", "T", "q", "sigma", "sigma_over_B", "lr", "lr_schedule")},
            "losses": losses,
            "epsilon_spent": [r["epsilon_spent"] for r in runs],
            "mean": statistics.fmean(losses),
            "sd": statistics.stdev(losses) if len(losses) > 1 else 0.0,
            "share_of_control_gain": (base - statistics.fmean(losses)) / gain if gain else None,
        }
    return {
        "base_loss": base,
        "control_loss": control["loss"],
        "control_settings": {k: control[k] for k in ("B", "T", "lr", "lr_schedule")},
        "epochs": setup["epochs"],
        "num_units": setup["num_units"],
        "max_seq_len": setup["max_seq_len"],
        "arms": arms,
    }


def table_md(report: dict) -> str:
    lines = [
        f"base {report['base_loss']:.4f}, control {report['control_loss']:.4f} nats/token; E = {report['epochs']:g}, "
        f"N = {report['num_units']}, max_seq_len {report['max_seq_len']}",
        "",
        "| row | B | T | σ | σ/B | lr | schedule | held-out loss (mean ± sd) | share of control's gain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, arm in report["arms"].items():
        s = arm["settings"]
        share = arm["share_of_control_gain"]
        lines.append(
            f"| {name} | {s['B']} | {s['T']} | {s['sigma']:.3f} | {s['sigma_over_B']:.4f} | {s['lr']:.3g} | "
            f"{s['lr_schedule']} | {arm['mean']:.4f} ± {arm['sd']:.4f} | "
            + ("-" if share is None else f"{share:.3f}")
            + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=float, default=1.0, help="compute budget in epochs (real mode)")
    parser.add_argument("--rows", type=int, default=3200, help="Bitext training rows kept, N (real mode)")
    parser.add_argument("--max-seq-len", type=int, default=48, help="tokens per record (real mode)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (each at --threads)")
    parser.add_argument("--toy", action="store_true", help="tiny random model and generated tickets")
    args = parser.parse_args(argv)
    from dplora.release.keys import generate_keypair

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dplora-planner-") as tmp:
        tmp = Path(tmp)
        key, _ = generate_keypair(tmp / "bench.key")
        from utility_bench import isolate_user_state

        isolate_user_state(tmp)
        if args.toy:
            setup = _toy_setup(tmp, args.threads)
        else:
            setup = _real_setup(tmp, args.threads, args.epochs, args.rows, args.max_seq_len)
        report = compare(setup, tmp / "runs", key, args.repeats, args.jobs)
    (args.out / "planner_compare.json").write_text(json.dumps(report, indent=1))
    (args.out / "planner_compare.md").write_text(table_md(report))
    print(table_md(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
