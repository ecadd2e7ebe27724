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
seeded hash), ε = 8, PRV. Hours on a CPU: the lead runs it, e.g.

    flock /work/notes/cpu.lock .venv/bin/python scripts/planner_compare.py --out bench-planner --repeats 3

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
    from dplora.recipe.train import run_training

    result = run_training(
        parse_contract(raw), signing_key=key, data_key=None, overwrite=True, progress=False, log=_quiet
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
    from dplora.data.units import tokenize_records
    from dplora.engine.model import load_model_and_tokenizer
    from dplora.evaluate.heldout import record_nll

    model, tokenizer = load_model_and_tokenizer(ModelSection(**setup["model"]), _quiet)
    model.eval()
    if folder is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, Path(folder) / "adapter", is_trainable=False).eval()
    contract = parse_contract(_contract(setup, Path(tempfile.gettempdir()) / "unused", arm="hand"))
    examples = tokenize_records(datasets.Dataset.from_list(setup["held"]), tokenizer, contract)
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


def _real_setup(tmp: Path, threads: int, epochs: float) -> dict:
    from utility_bench import QUICK, bitext_data

    path, held = bitext_data(QUICK, tmp)  # one-turn conversations (issue 31): jsonl, one record per line
    n = sum(1 for _ in open(path, encoding="utf-8"))  # rows of a public dataset
    return {
        "model": {"name": "smollm2-135m"},
        "train": path,
        "held": [{"messages": r["messages"]} for r in held],
        "columns": {"record_format": "messages", "prompt_column": None, "response_column": None},
        "num_units": n,
        "epochs": epochs,
        "epsilon": 8.0,
        "delta": 1e-6,
        "accountant": "prv",
        "physical": 16,
        "max_seq_len": 64,
        "r": 8,
        "threads": threads,
    }


def compare(setup: dict, out: Path, key: Path, repeats: int) -> dict:
    """Train and score every row; returns the JSON report."""
    base = _held_out_loss(setup, None)
    control = _train(_contract(setup, out / "control", arm="hand", enabled=False), key)
    control["loss"] = _held_out_loss(setup, control["folder"])
    arms = {}
    for arm in ("hand", "planner"):
        runs = []
        for i in range(repeats):
            run = _train(_contract(setup, out / f"{arm}-{i}", arm=arm), key)
            run["loss"] = _held_out_loss(setup, run["folder"])
            runs.append(run)
        losses = [r["loss"] for r in runs]
        gain = base - control["loss"]
        arms[arm] = {
            "settings": {k: runs[0][k] for k in ("B", "T", "q", "sigma", "sigma_over_B", "lr", "lr_schedule")},
            "losses": losses,
            "mean": statistics.fmean(losses),
            "sd": statistics.stdev(losses) if len(losses) > 1 else 0.0,
            "share_of_control_gain": (base - statistics.fmean(losses)) / gain if gain else None,
        }
    return {"base_loss": base, "control_loss": control["loss"], "epochs": setup["epochs"], "arms": arms}


def table_md(report: dict) -> str:
    lines = [
        f"base {report['base_loss']:.4f}, control {report['control_loss']:.4f} nats/token; E = {report['epochs']:g}",
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
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--toy", action="store_true", help="tiny random model and generated tickets")
    args = parser.parse_args(argv)
    from dplora.release.envelope import generate_keypair

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dplora-planner-") as tmp:
        tmp = Path(tmp)
        key, _ = generate_keypair(tmp / "bench.key")
        setup = _toy_setup(tmp, args.threads) if args.toy else _real_setup(tmp, args.threads, args.epochs)
        report = compare(setup, tmp / "runs", key, args.repeats)
    (args.out / "planner_compare.json").write_text(json.dumps(report, indent=1))
    (args.out / "planner_compare.md").write_text(table_md(report))
    print(table_md(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
