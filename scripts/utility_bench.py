"""Utility benchmark: what DP costs in quality on real support data, with the packaged SmolLM2-135M.

Two tasks, read in place from ``../shared/data`` (subsets go to a temporary folder that is removed at the end;
nothing is copied into the repository):

- **Banking77** intent classification as prompt → label (``text`` → ``category``): accuracy on a subset of the
  test split. Each candidate label is scored by its log-likelihood under the model (the summed NLL of the
  label's tokens and EOS after ``TEXT\\n``, masked exactly as in training) and the best one is picked:
  forward passes only, no generation.
- **Bitext** ticket replies as one-turn conversations (``instruction`` → user turn, ``response`` → assistant turn,
  ``data.record_format: messages``): trained through the model's chat template with the assistant mask, and the
  held-out loss per target token and perplexity measured through the same template and mask (the assistant span
  only) on a held-out subset of rows (split by a seeded hash of the row index, never seen in training).

Rows (``--quick``, ``--toy``): the base model (floor), the non-private control (``privacy.enabled: false``), DP at
ε ∈ {1, 3, 8}, all at the same epochs (so the same steps), learning rate, LoRA and seed; then a sweep of the logical
batch size at ε = 3 and equal epochs (Banking77 only in ``--quick``).

Rows (``--full``, ``--cpu``, ``--toy --full``; issue 33): base; the non-private control at the planner's B, T, lr and
schedule (for the largest ε); DP with the planner's choice (``training.expected_batch_size: auto``, ``steps: auto``,
E = 3 epochs, B up to 1,024) at each ε; DP with the demo's hand settings (:data:`HAND`, configs/demo.yaml) at the
same epochs; each trained ``--repeats`` times (mean and sample standard deviation), last checkpoint, no selection
on held-out data. The report gives the DP share of the control's gain over base per task and ε,
(base − dp)/(base − control) for loss and (dp − base)/(control − base) for accuracy, and the goal checks at ε = 8
(Bitext ≥ 90 % of the control's gain, Banking77 within 3 points of the control). ``--cpu`` cuts the design to
about 2.5 h on 2 CPU cores (both tasks at ε = 3 and 8 on small N, ``--jobs 2``, see :data:`CPU`); docs/utility.md
gives the sizes and estimates. A DP-hand row whose resolved settings (B, T, lr, schedule, warmup) equal the
DP-planner row's at the same ε is not trained again: it carries that row's numbers and ``same_as`` names it.

Every run goes through dplora's own training path (:func:`dplora.recipe.train.run_training`: Poisson sampling,
per-unit clipping, noise, accountant, signed release); evaluation uses :mod:`dplora.evaluate.heldout`
(``record_nll``, ``group_stats``) on the GPU when there is one. Per-group numbers (Banking77 intent, Bitext
category) are reported for every run, and the groups that DP at ε = 3 hurts most against the control are listed
with their sizes.

Output: ``DIR/utility.json``, ``DIR/utility.md`` and ``DIR/utility.png`` (utility against ε).

    flock /work/notes/cpu.lock .venv/bin/python scripts/utility_bench.py --quick --out bench-utility
    .venv/bin/python scripts/utility_bench.py --toy --out /tmp/u   # a tiny random chat model, seconds (tests)
    .venv/bin/python scripts/utility_bench.py --full --out bench-utility-full     # a GPU; days on a CPU
    .venv/bin/python scripts/utility_bench.py --cpu --jobs 2 --out bench-utility-cpu  # ~2.5 h on 2 cores
    .venv/bin/python scripts/utility_bench.py --toy --full --out /tmp/u            # the --full design, tiny model
    .venv/bin/python scripts/utility_bench.py --study lr-x3 --threads 1 --out /tmp/s  # issue 43: one Bitext DP row
    .venv/bin/python scripts/utility_bench.py --study ffa --toy --out /tmp/s          # the same on the tiny model

``--study LEVER [LEVER …]`` (issue 43) trains one Bitext DP row at ε = 8 with the ``--cpu`` preset and only the
named levers (:data:`STUDY_LEVERS`) changed, scores it on the held-out rows and on validation rows carved from the
training rows after the first N (:func:`bitext_validation`), and appends it to ``docs/utility-study.json`` and the
table in ``docs/utility.md`` (``--study-json``/``--study-md`` elsewhere); base and control are not retrained.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# the shared data folder; DPLORA_UTILITY_DATA points elsewhere (the GPU check carries a copy in .gpu/data)
DATA = Path(os.environ.get("DPLORA_UTILITY_DATA") or ROOT.parent / "shared" / "data")
BANKING = DATA / "banking77"
BITEXT = DATA / "bitext_customer_support" / "Bitext_Sample_Customer_Support_Training_Dataset.csv"
TWCS = DATA / "twcs_customer_support_twitter" / "twcs_first5000.csv"  # warm-twcs: another corpus (issue 49)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """One task's settings: LoRA/optimiser shared by every run of the task, and what is evaluated."""

    name: str
    max_seq_len: int
    epochs: float
    batch: int  # expected units per logical step of the ε rows and the control
    sweep: tuple[int, ...]  # logical batch sizes at ε = 3, equal epochs
    lr: float
    clip: float
    r: int
    physical: int
    eval_rows: int  # per intent (Banking77) or in all (Bitext)
    targets: tuple[str, ...] = ("q_proj", "v_proj")  # ("all-linear",): peft's keyword
    freeze_a: bool = False  # FFA-LoRA: A frozen at its init, only B trained (lora.freeze_a)
    optimizer: str = "adamw"  # training.optimizer ("dp_adambc": DP-AdamBC, dplora.mechanism.adambc)
    clipping: str = "clip"  # privacy.clipping ("normalize": automatic clipping, Bu et al. 2023)
    warm_start: str | None = None  # data.public_warm_start from "demo" (generated tickets) or "twcs" (tweet pairs)
    max_steps: int | None = None  # a cap on T of every run (--max-steps; the GPU check's dry run), None: no cap


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    epsilons: tuple[float, ...]
    delta: float
    seed: int
    intents: tuple[str, ...] | None  # Banking77 labels kept (None: all 77)
    banking: Task
    bitext: Task
    max_train_rows: int | None = None  # training rows kept per task, in file order (None: all)
    toy: bool = False  # a tiny random Llama with a ChatML template instead of the packaged model
    # "sweep" (--quick, --toy): control, DP at each ε and a batch sweep at one task batch and lr.
    # "planner" (--full, --cpu): control at the planner's B and T, DP with the planner's choice at each ε, DP with
    # the demo's hand settings at each ε in hand_epsilons (None: every ε), ``repeats`` trainings per row.
    design: str = "sweep"
    repeats: int = 1
    accountant: str = "prv"
    hand_epsilons: tuple[float, ...] | None = None
    label: str = ""  # what the preset is, printed in the output (e.g. the CPU preset's cuts)
    tasks: tuple[str, ...] = ("banking77", "bitext")  # the tasks run unless --only names one
    train_per_intent: int | None = None  # Banking77 training rows kept per intent, in file order (None: all)
    max_chars: int | None = None  # Bitext cells cut to this many characters (toy only: short byte-token sequences)
    # the study's public warm start (data.public_warm_start): steps, records per step, AdamW lr (see WARM_START)
    warm_start: tuple[int, int, float] = (100, 8, 1e-3)


QUICK = Settings(
    epsilons=(1.0, 3.0, 8.0),
    delta=1e-5,
    seed=0,
    intents=("card_arrival", "card_linking", "exchange_rate", "lost_or_stolen_card", "pending_top_up"),
    banking=Task(
        name="banking77",
        max_seq_len=32,
        epochs=0.6,  # N = 636 training rows of the 5 intents: T = ceil(0.6 * 636 / 128) = 3 steps
        batch=128,
        sweep=(32,),  # 12 steps of 32, against the main runs' 3 steps of 128: 0.6 epochs each
        lr=1e-2,
        clip=0.1,
        r=2,
        physical=32,
        eval_rows=12,
    ),
    bitext=Task(
        name="bitext",
        max_seq_len=40,
        epochs=0.18,  # N = 4,063 training rows: T = ceil(0.18 * 4063 / 256) = 3 steps
        batch=256,
        sweep=(64,),  # 12 steps of 64, against the main runs' 3 steps of 256: 0.18 epochs each
        lr=1e-2,
        clip=0.1,
        r=2,
        physical=32,
        eval_rows=100,
    ),
)
TOY = Settings(
    epsilons=(3.0,),
    delta=1e-5,
    seed=0,
    intents=("card_arrival", "exchange_rate", "pending_top_up"),
    banking=Task(
        name="banking77",
        max_seq_len=160,
        epochs=0.5,
        batch=16,
        sweep=(),
        lr=1e-2,
        clip=0.1,
        r=2,
        physical=8,
        eval_rows=2,
    ),
    bitext=Task(
        name="bitext",
        max_seq_len=1200,  # whole conversations (the longest Bitext row is about 1,050 byte tokens here)
        epochs=0.5,
        batch=16,
        sweep=(),
        lr=1e-2,
        clip=0.1,
        r=2,
        physical=8,
        eval_rows=6,
    ),
    max_train_rows=48,
    toy=True,
)
HAND = {"expected_batch_size": 32, "lr": 0.002}  # configs/demo.yaml: the dp-hand rows (constant lr, no warmup)
FULL = Settings(
    epsilons=(1.0, 3.0, 8.0),
    delta=1e-5,
    seed=0,
    intents=None,  # all 77 intents: N = 10,003 training rows
    design="planner",
    repeats=3,
    label="full: every row, all 77 intents, all training rows, 3 repeats",
    banking=Task(
        name="banking77",
        max_seq_len=96,  # through the template: 50 tokens at the median, 97 at most (SmolLM2's tokenizer)
        epochs=3.0,  # E for the planner (B ≤ 1,024, T ≥ 50), the hand rows and the control
        batch=32,  # unused in the planner design (B comes from the planner or HAND)
        sweep=(),
        lr=0.002,  # the planner's reference rate at B = 32 (the demo's lr); it scales by sqrt(B/32)
        clip=0.1,
        r=8,
        physical=32,
        eval_rows=10,  # per intent: 770 test rows, each scored against the 77 labels
    ),
    bitext=Task(
        name="bitext",
        max_seq_len=320,  # whole conversations through the template: 212 tokens at the median, 269 at p99, 328 max
        epochs=3.0,
        batch=32,
        sweep=(),
        lr=0.002,
        clip=0.1,
        r=8,
        physical=16,
        eval_rows=400,
    ),
)
# --cpu: about 2.5 h on 2 idle CPU cores with --jobs 2 (docs/utility.md gives the measured minutes). The planner needs
# T ≥ 50 at B ≥ 32, so one run trains on ≥ 1,600 rows whatever N is; SmolLM2-135M trains about 1.4 rows/s per core
# at 64 tokens, so each task keeps the smallest N that reaches T ≥ 50 and three trainings (control, ε = 3, ε = 8).
# At these N only B = 32 is eligible, so the planner's choice is the hand settings (B = 32, lr 0.002, constant):
# the DP-hand rows are not trained twice but point at the DP-planner row with the same settings (``same_as``).
CPU = dataclasses.replace(
    FULL,
    epsilons=(3.0, 8.0),
    hand_epsilons=(3.0, 8.0),
    repeats=1,
    intents=QUICK.intents,
    train_per_intent=120,  # N = 3·120 + 112 + 82 = 554: T = ceil(3·554/32) = 52 at B = 32 (B = 48: T = 35 < 50)
    max_train_rows=1600,  # Bitext: N = 1,600 (Banking77's 554 are below it): T = ceil(1·1600/32) = 50 at B = 32
    label=(
        "cpu preset: Banking77 5 intents, up to 120 training rows each (N = 554), 3 epochs (T = 52 at B = 32), "
        "12 test rows per intent; Bitext the first 1,600 training rows (N = 1,600), 1 epoch (T = 50 at B = 32), "
        "100 held-out conversations; max_seq_len 64 for both (Bitext conversations are cut: the reply keeps about "
        "30 tokens after the template's system prompt); rows base, control, DP-planner and DP-hand at ε = 3 and 8 "
        "(the planner's choice is the hand settings at these N); 1 repeat"
    ),
    banking=dataclasses.replace(FULL.banking, max_seq_len=64, physical=16, eval_rows=12),
    bitext=dataclasses.replace(FULL.bitext, epochs=1.0, max_seq_len=64, physical=16, eval_rows=100),
)
# --toy --full: the planner design on the tiny random chat model, seconds per run (tests, the GPU check's dry run).
# N = 160 rows and E = 10 give T = 50 at B = 32 (the planner needs B ≤ N/4 and T ≥ 50).
TOY_FULL = dataclasses.replace(
    TOY,
    epsilons=(3.0, 8.0),
    design="planner",
    repeats=1,
    accountant="rdp",
    max_train_rows=160,
    max_chars=60,  # byte tokens: short conversations keep each run to seconds
    warm_start=(4, 4, 1e-3),  # a few public steps: the lever's path, in seconds
    label="toy full: the planner design on a tiny random chat model",
    banking=dataclasses.replace(TOY.banking, epochs=10.0, lr=0.01, physical=32),
    bitext=dataclasses.replace(TOY.bitext, max_seq_len=192, epochs=10.0, lr=0.01, physical=32),
)


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _write_csv(path: Path, rows: list[dict], columns: list[str]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _count_rows(path: Path) -> int:
    """Records in a csv or jsonl file of this benchmark (public data: the count may be declared)."""
    if path.suffix == ".jsonl":
        return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return len(_read_csv(path))


def isolate_user_state(tmp: Path) -> None:
    """Point ``DPLORA_LEDGER`` and ``DPLORA_CACHE_DIR`` into ``tmp`` for this process and its children, so that a
    benchmark never charges the user's ledger or writes the user's calibration cache; the converted model is
    still reused from the user's cache (``tmp/cache/models`` links to it)."""
    from dplora.accounting.cache import cache_dir

    user_models = cache_dir() / "models"
    user_models.mkdir(parents=True, exist_ok=True)
    (tmp / "cache").mkdir(exist_ok=True)
    if not (tmp / "cache" / "models").exists():
        (tmp / "cache" / "models").symlink_to(user_models, target_is_directory=True)
    os.environ["DPLORA_LEDGER"] = str(tmp / "ledger.sqlite3")
    os.environ["DPLORA_CACHE_DIR"] = str(tmp / "cache")


def _held_out(index: int, seed: int, fraction: float) -> bool:
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def banking_data(settings: Settings, tmp: Path) -> tuple[Path, list[dict], list[str]]:
    """(training csv in tmp, test rows kept, candidate labels)."""
    train, test = _read_csv(BANKING / "train.csv"), _read_csv(BANKING / "test.csv")
    labels = list(settings.intents or json.loads((BANKING / "categories.json").read_text()))
    keep = set(labels)
    train = [r for r in train if r["category"] in keep]
    if settings.train_per_intent is not None:  # the file is sorted by intent: keep the first rows of each
        train = [
            r for label in labels for r in [r for r in train if r["category"] == label][: settings.train_per_intent]
        ]
    train = train[: settings.max_train_rows]
    per, kept = settings.banking.eval_rows, []
    for label in labels:  # the first `per` test rows of each intent, in file order
        kept += [r for r in test if r["category"] == label][:per]
    return _write_csv(tmp / "banking_train.csv", train, ["text", "category"]), kept, labels


def conversation(row: dict) -> dict:
    """A Bitext row as a one-turn conversation record: instruction → user turn, response → assistant turn."""
    turns = [{"role": "user", "content": row["instruction"]}, {"role": "assistant", "content": row["response"]}]
    return {"messages": turns, "category": row["category"]}


def bitext_data(settings: Settings, tmp: Path) -> tuple[Path, list[dict]]:
    """(training jsonl of conversations in tmp: rows not held out, held-out conversations kept for evaluation)."""
    rows = _read_csv(BITEXT)
    for r in rows:
        r["response"] = r["response"].replace("\r\n", "\n")
        if settings.max_chars is not None:
            r["instruction"], r["response"] = (
                r["instruction"][: settings.max_chars],
                r["response"][: settings.max_chars],
            )
    held = [i for i in range(len(rows)) if _held_out(i, settings.seed, 0.1)]
    out = set(held)
    train = [conversation(r) for i, r in enumerate(rows) if i not in out][: settings.max_train_rows]
    kept = [conversation(rows[i]) for i in held[: settings.bitext.eval_rows]]
    path = tmp / "bitext_train.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in train), encoding="utf-8")
    return path, kept


def contract_for(task: Task, settings: Settings, path: Path, columns: dict, out: Path, **kw) -> dict:
    """A row-level contract for one run (the packaged model, or ``model`` in ``kw``); ``columns``: the data section's
    record format keys; ``kw``: epsilon, batch, enabled, model, and ``arm``: None (the task's batch and lr at its
    epochs), ``"planner"`` (``expected_batch_size: auto``, ``steps: auto`` at the task's epochs, the task's lr as
    the reference at B = 32), ``"hand"`` (:data:`HAND`'s B and lr at the task's epochs) or ``"fixed"`` (``fixed``:
    the planner's resolved B, T, lr, schedule and warmup, for the control)."""
    training = {
        "expected_batch_size": kw.get("batch", task.batch) or _count_rows(path),  # 0: B = N (q = 1)
        "physical_batch_size": task.physical,
        "epochs": task.epochs,
        "lr": task.lr,
        "max_seq_len": task.max_seq_len,
        "seed": settings.seed,
        "output_dir": str(out),
        **({"optimizer": task.optimizer} if task.optimizer != "adamw" else {}),
    }
    arm = kw.get("arm")
    if arm == "planner":
        # an integer steps caps the planner's T (and lowers its step floor to the cap: plan.planner.step_floor)
        training |= {"expected_batch_size": "auto", "steps": task.max_steps or "auto"}
    elif arm == "hand":
        training |= HAND
    elif arm == "explicit":  # a frontier point: the task's B (0: B = N, q = 1) and E, the planner's sqrt(B) rate
        from dplora.plan.planner import scaled_lr

        batch = task.batch or _count_rows(path)
        training |= {"expected_batch_size": batch, "lr": scaled_lr(task.lr, batch)}
    elif arm == "fixed":
        training.pop("epochs")
        training |= kw["fixed"]
    if task.max_steps is not None and arm in (None, "hand", "explicit"):  # a fixed B: T = the cap instead of the epochs
        training.pop("epochs")
        training["steps"] = task.max_steps
    return {
        "privacy": {
            "protected_unit": "row",
            "adjacency": "add_remove",
            "target_epsilon": kw.get("epsilon", 3.0),
            "delta": settings.delta,
            "accountant": settings.accountant,
            "max_grad_norm": task.clip,
            **({"clipping": task.clipping} if task.clipping != "clip" else {}),
            "sampling": "poisson",
            "enabled": kw.get("enabled", True),
            # the benchmark's data is public: its row count is declared as the public N (add/remove needs one)
            "num_units": _count_rows(path),
        },
        "model": kw.get("model") or {"name": "smollm2-135m"},
        "data": {"path": str(path), **columns, **({"public_warm_start": kw["warm"]} if kw.get("warm") else {})},
        "lora": {
            "r": task.r,
            "alpha": 2.0 * task.r,
            "target_modules": task.targets[0] if task.targets == ("all-linear",) else list(task.targets),
            **({"freeze_a": True} if task.freeze_a else {}),
        },
        "training": training,
    }


def run_specs(task: Task, settings: Settings) -> list[dict]:
    """The runs of one task. Sweep design: control, DP at each ε (main batch), then the batch sweep at ε = 3.
    Planner design: the control (``arm: fixed``, the planner's B and T at the largest ε, filled in by
    :func:`resolved_settings` of the planner's contract), DP with the planner's choice at each ε, DP with the hand
    settings."""
    if settings.design == "planner":
        top = max(settings.epsilons)
        specs = [{"name": "non-private", "kind": "control", "arm": "fixed", "enabled": False, "epsilon": top}]
        specs += [
            {"name": f"dp-planner-eps{e:g}", "kind": "dp-planner", "arm": "planner", "epsilon": e}
            for e in settings.epsilons
        ]
        hand = settings.epsilons if settings.hand_epsilons is None else settings.hand_epsilons
        specs += [{"name": f"dp-hand-eps{e:g}", "kind": "dp-hand", "arm": "hand", "epsilon": e} for e in hand]
        return specs
    specs = [{"name": "non-private", "kind": "control", "enabled": False, "epsilon": 3.0, "batch": task.batch}]
    specs += [{"name": f"dp-eps{e:g}", "kind": "dp", "epsilon": e, "batch": task.batch} for e in settings.epsilons]
    specs += [{"name": f"dp-eps3-B{b}", "kind": "sweep", "epsilon": 3.0, "batch": b} for b in task.sweep]
    return specs


def resolved_settings(raw: dict) -> dict:
    """B, T, lr, schedule and warmup a contract trains with (``auto`` resolved by the planner, T from the epochs
    and the declared N otherwise; public inputs only)."""
    from dplora.contract.loader import parse_contract
    from dplora.plan.resolve import resolve_auto
    from dplora.plan.training import planned_steps

    resolved, _ = resolve_auto(parse_contract(raw))
    t = resolved.training.model_dump(mode="json")
    t["steps"] = planned_steps(resolved, resolved.privacy.num_units)
    t["lr_schedule"] = t["lr_schedule"] or "constant"  # none given: the engine runs a constant rate
    t["warmup_steps"] = t["warmup_steps"] or 0
    return {k: t[k] for k in ("expected_batch_size", "steps", "lr", "lr_schedule", "warmup_steps")}


def train_one(raw: dict, key: Path, threads: int) -> dict:
    """Train through dplora's own path; returns the plan's public numbers and seconds."""
    from dplora.contract.loader import parse_contract
    from dplora.recipe.config import RunOptions
    from dplora.recipe.train import run_training
    from dplora.run.checkpoint import checkpoint_file

    # a checkpoint left by a killed study run (same stable work folder, so same contract and data): resume it
    staging = Path(f"{raw['training']['output_dir']}.partial")
    resume = checkpoint_file(staging).exists()
    result = run_training(
        parse_contract(raw),
        RunOptions(
            signing_key=key, data_key=None, overwrite=not resume, resume=resume, threads=threads, progress=False
        ),
        log=_quiet,
    )
    p = result.plan
    return {
        "batch": p.expected_batch_size,
        "steps": p.steps,
        "q": p.sample_rate,
        "sigma": p.noise_multiplier,
        "lr": p.lr,
        "lr_schedule": None if p.lr_schedule is None else str(getattr(p.lr_schedule, "value", p.lr_schedule)),
        "epsilon_spent": result.epsilon_spent if result.differentially_private else None,
        "train_seconds": round(result.seconds, 1),
        "s_per_step": round(result.seconds_per_step, 2),
        "folder": str(result.output_dir),
        "resumed": resume,  # then the seconds are the resumed part's only
    }


def _quiet(message: str) -> None:
    pass


class Scorer:
    """Loads the base model once; scores the base model or a run's adapters on both tasks."""

    def __init__(self, threads: int, model: dict | None = None):
        import torch

        from dplora.contract.spec import ModelSection
        from dplora.engine.model import load_model_and_tokenizer

        torch.set_num_threads(threads)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        section = ModelSection(**(model or {"name": "smollm2-135m"}))
        self.base, self.tokenizer = load_model_and_tokenizer(section, _quiet)
        self.base.to(self.device).eval()

    def model(self, folder: str | None):
        if folder is None:
            return self.base
        from peft import PeftModel

        model = PeftModel.from_pretrained(self.base, Path(folder) / "adapter", is_trainable=False)
        return model.to(self.device).eval()

    def release(self, model) -> None:
        if model is not self.base:
            model.unload()  # removes the LoRA layers, the base model stays as it was

    def nll(self, model, table, contract, batch: int):
        """Per-record NLL and target tokens, tokenized and masked as training did (the template for conversations)."""
        from dplora.data.tokens import tokenize_records
        from dplora.evaluate.heldout import record_nll

        examples = tokenize_records(table, self.tokenizer, contract.data, max_seq_len=contract.training.max_seq_len)
        return record_nll(model, examples, pad_id=self.tokenizer.pad_token_id, device=self.device, batch_size=batch)


def banking_eval(scorer: Scorer, model, test: list[dict], labels: list[str], contract, *, calibrate=True) -> dict:
    """Accuracy by candidate log-likelihood, per-intent accuracy, and the true label's loss per token.

    ``accuracy`` picks the label with the smallest SUMMED negative log-likelihood (the fixed reference's scoring);
    ``accuracy_per_token`` picks the smallest MEAN per label token (length-normalised scoring, as lm-eval-harness's
    ``acc_norm`` normalises by length), a diagnostic for labels of unequal token length, from the same forwards."""
    import datasets

    from dplora.evaluate.report import group_stats

    pairs = [{"text": r["text"], "category": label} for r in test for label in labels]
    nll, tokens = scorer.nll(model, datasets.Dataset.from_list(pairs), contract, batch=64)
    k = len(labels)
    picks, per_token, true_nll, true_tok = [], [], [], []
    for i, row in enumerate(test):
        scores = nll[i * k : (i + 1) * k]
        picks.append(labels[min(range(k), key=scores.__getitem__)])
        mean = [n / max(t, 1) for n, t in zip(scores, tokens[i * k : (i + 1) * k], strict=True)]
        per_token.append(labels[min(range(k), key=mean.__getitem__)])
        j = i * k + labels.index(row["category"])
        true_nll.append(nll[j])
        true_tok.append(tokens[j])
    correct = [p == r["category"] for p, r in zip(picks, test, strict=True)]
    groups, hidden = group_stats([r["category"] for r in test], true_nll, true_tok, correct, min_records=1)
    calibrated = calibrated_eval(scorer, model, test, labels, contract) if calibrate else None
    return {
        "accuracy": sum(correct) / len(correct),
        "accuracy_per_token": sum(p == r["category"] for p, r in zip(per_token, test, strict=True)) / len(test),
        # the product's classification path (dplora.evaluate.classify): per-token, calibrated on "N/A"
        **(
            {
                "accuracy_calibrated": calibrated["accuracy_calibrated"],
                "per_label_recall": {g["label"]: g["recall_calibrated"] for g in calibrated["per_label"]},
                # the product's default headline (data.calibration: none): per token, uncalibrated
                "per_label_recall_per_token": {g["label"]: g["recall_uncalibrated"] for g in calibrated["per_label"]},
            }
            if calibrated is not None
            else {}
        ),
        "label_loss": math.fsum(true_nll) / sum(true_tok),
        "records": len(test),
        "groups": [dataclasses.asdict(g) for g in groups],
    }


def calibrated_eval(scorer: Scorer, model, test: list[dict], labels: list[str], contract) -> dict:
    """Banking77 scored as ``dplora eval`` scores a declared classification task: each label's length-normalised
    log-likelihood minus its score on the fixed content-free input (Zhao et al. 2021, "Calibrate before use"),
    through :func:`dplora.evaluate.classify.classify` and :func:`~dplora.evaluate.classify.classification_stats`.

    Returns:
        ``classification_stats``' dict: ``accuracy_calibrated``, ``accuracy_uncalibrated``, ``per_label`` recall
        under both (every intent: the test rows are balanced and public), ``bias``.
    """
    from dplora.evaluate.classify import classification_stats, classify

    prompts = [r["text"] for r in test]
    bias, scores = classify(
        model, scorer.tokenizer, prompts, labels, contract.data, contract.training, device=scorer.device
    )
    return classification_stats(labels, [r["category"] for r in test], scores, bias, min_records=1)


def bitext_eval(scorer: Scorer, model, held: list[dict], contract) -> dict:
    """Held-out loss per target token, perplexity, and per-category loss."""
    import datasets

    from dplora.evaluate.report import group_stats

    nll, tokens = scorer.nll(model, datasets.Dataset.from_list(held), contract, batch=32)
    loss = math.fsum(nll) / sum(tokens)
    groups, _ = group_stats([r["category"] for r in held], nll, tokens, min_records=1)
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "records": len(held),
        "tokens": sum(tokens),
        "groups": [dataclasses.asdict(g) for g in groups],
    }


def worst_groups(rows: list[dict], task: str, metric: str, *, top: int = 3, dp_name: str = "dp-eps3") -> list[dict]:
    """Groups where DP at ε = 3 (``dp_name``: main batch, or the planner's row) falls furthest behind the control,
    with their sizes."""
    by_name = {r["name"]: r for r in rows if r["task"] == task}
    control, dp = by_name.get("non-private"), by_name.get(dp_name)
    if control is None or dp is None:
        return []
    sign = -1 if metric == "accuracy" else 1  # accuracy falls, loss rises
    out = []
    for c, d in zip(control["eval"]["groups"], dp["eval"]["groups"], strict=True):
        gap = sign * (d[metric] - c[metric])
        out.append(
            {"group": c["group"], "records": c["records"], "control": c[metric], "dp_eps3": d[metric], "gap": gap}
        )
    return sorted(out, key=lambda g: -g["gap"])[:top]


def _mean_sd(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for one value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


METRICS = ("accuracy", "label_loss", "loss", "perplexity")


def aggregate(runs: list[dict]) -> dict:
    """One row from R repeats of a run: ``eval`` holds the mean of each metric (and of each group's), ``spread``
    the sample standard deviation over repeats (None for R = 1), ``repeats`` every repeat's numbers."""
    evals = [r["eval"] for r in runs]
    mean, spread = {}, {}
    for m in METRICS:
        if m in evals[0]:
            mean[m], spread[m] = _mean_sd([e[m] for e in evals])
    for k in ("records", "tokens"):
        if k in evals[0]:
            mean[k] = evals[0][k]
    groups = []
    for i, g in enumerate(evals[0]["groups"]):
        avg = dict(g)
        for m in ("accuracy", "loss"):
            if g.get(m) is not None:
                avg[m] = statistics.fmean(e["groups"][i][m] for e in evals)
        groups.append(avg)
    mean["groups"] = groups
    first = runs[0]
    keys = ("batch", "steps", "q", "sigma", "epsilon_spent", "lr", "lr_schedule")
    row = {k: first[k] for k in keys if k in first}
    seconds = math.fsum(r["train_seconds"] + r["eval_seconds"] for r in runs)
    return row | {
        "eval": mean,
        "spread": spread,
        "train_seconds": round(math.fsum(r["train_seconds"] for r in runs) / len(runs), 1),  # per repeat
        "eval_seconds": round(math.fsum(r["eval_seconds"] for r in runs) / len(runs), 1),
        "minutes": round(seconds / 60, 2),  # all repeats of the row: training and evaluation
        "repeats": [{k: v for k, v in r.items() if k != "folder"} | {"eval": _no_groups(r["eval"])} for r in runs],
        "folders": [r["folder"] for r in runs],
    }


def _no_groups(e: dict) -> dict:
    return {k: v for k, v in e.items() if k != "groups"}


def shares(rows: list[dict]) -> dict:
    """The DP share of the control's gain over the base model, per task, ε and DP kind (planner design):
    (base − dp)/(base − control) for Bitext's held-out loss, (dp − base)/(control − base) for Banking77's accuracy;
    1 = all of the control's gain, 0 = none, None when the control gains nothing (base = control)."""
    out = {}
    for task, metric in (("banking77", "accuracy"), ("bitext", "loss")):
        mine = [r for r in rows if r["task"] == task]
        kinds = {r["kind"]: r for r in mine if r["kind"] in ("base", "control")}
        if len(kinds) < 2:
            continue
        base, control = kinds["base"]["eval"][metric], kinds["control"]["eval"][metric]
        gain = control - base if metric == "accuracy" else base - control
        per = {}
        for r in mine:
            if r["kind"] in ("dp-planner", "dp-hand"):
                dp = r["eval"][metric]
                got = dp - base if metric == "accuracy" else base - dp
                per.setdefault(f"{r['epsilon']:g}", {})[r["kind"]] = None if gain == 0 else got / gain
        out[task] = {"metric": metric, "base": base, "control": control, "control_gain": gain, "by_epsilon": per}
    return out


def goal_full(rows: list[dict], share: dict) -> dict:
    """The issue-33 goal at ε = 8 with the planner's choice: Bitext ≥ 90 % of the control's gain in held-out loss;
    Banking77 accuracy within 3 points of the control."""
    out = {}
    by = {(r["task"], r["name"]): r["eval"] for r in rows}
    if "bitext" in share and ("bitext", "dp-planner-eps8") in by:
        s8 = share["bitext"]["by_epsilon"]["8"]["dp-planner"]
        out["bitext"] = {
            "epsilon": 8,
            "share_of_control_gain": s8,
            "required": 0.9,
            "met": s8 is not None and s8 >= 0.9,
        }
    if ("banking77", "dp-planner-eps8") in by and ("banking77", "non-private") in by:
        gap = by[("banking77", "non-private")]["accuracy"] - by[("banking77", "dp-planner-eps8")]["accuracy"]
        out["banking77"] = {
            "epsilon": 8,
            "control_minus_dp_points": round(100 * gap, 2),
            "required_points": 3.0,
            "met": gap <= 0.03,
        }
    return out


def _pm(mean: float, sd: float | None, digits: int) -> str:
    return f"{mean:.{digits}f}" + ("" if sd is None else f" ± {sd:.{digits}f}")


def table_full_md(rows: list[dict], share: dict) -> str:
    """The planner design's table: base / control / DP-planner / DP-hand per task and ε, mean ± sd over repeats."""
    lines = [
        "| task | run | ε | B | T | σ | lr (schedule) | repeats | Banking77 acc | Bitext loss "
        "| share of control's gain | min |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e, sd = r["eval"], r.get("spread", {})
        eps = "∞ (no DP)" if r["kind"] == "control" else ("—" if r["kind"] == "base" else f"{r['epsilon']:g}")
        acc = _pm(e["accuracy"], sd.get("accuracy"), 3) if "accuracy" in e else ""
        loss = _pm(e["loss"], sd.get("loss"), 4) if "loss" in e else ""
        sigma = f"{r['sigma']:.3f}" if r.get("sigma") else ("0" if r["kind"] == "control" else "—")
        lr = f"{r['lr']:.3g} ({r.get('lr_schedule') or 'constant'})" if "lr" in r else "—"
        got = share.get(r["task"], {}).get("by_epsilon", {}).get(f"{r.get('epsilon', 0):g}", {}).get(r["kind"])
        got = "" if got is None else f"{got:.3f}"
        name = r["name"] + (f" (same settings as {r['same_as']}: not trained again)" if r.get("same_as") else "")
        lines.append(
            f"| {r['task']} | {name} | {eps} | {r.get('batch', '—')} | {r.get('steps', '—')} | {sigma} | {lr} | "
            f"{len(r.get('repeats', [])) or '—'} | {acc} | {loss} | {got} | {r.get('minutes', '—')} |"
        )
    return "\n".join(lines)


def table_md(rows: list[dict]) -> str:
    lines = [
        "| task | run | ε | batch | steps | σ | Banking77 acc | Bitext loss | Bitext ppl | train s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e = r["eval"]
        eps = "∞ (no DP)" if r["kind"] == "control" else ("—" if r["kind"] == "base" else f"{r['epsilon']:g}")
        acc = f"{e['accuracy']:.3f}" if "accuracy" in e else ""
        loss = f"{e['loss']:.4f}" if "loss" in e else ""
        ppl = f"{e['perplexity']:.3f}" if "perplexity" in e else ""
        sigma = f"{r['sigma']:.3f}" if r.get("sigma") else ("0" if r["kind"] == "control" else "—")
        lines.append(
            f"| {r['task']} | {r['name']} | {eps} | {r.get('batch', '—')} | {r.get('steps', '—')} | {sigma} | {acc} | "
            f"{loss} | {ppl} | {r.get('train_seconds', '—')} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, task, metric, label in (
        (axes[0], "banking77", "accuracy", "Banking77 accuracy"),
        (axes[1], "bitext", "loss", "Bitext held-out loss (nats/token)"),
    ):
        mine = [r for r in rows if r["task"] == task]
        for kind, text in (("dp", "DP (main batch)"), ("dp-planner", "DP, planner"), ("dp-hand", "DP, hand (demo)")):
            dp = sorted((r for r in mine if r["kind"] == kind), key=lambda r: r["epsilon"])
            if dp:
                sd = [r.get("spread", {}).get(metric) or 0.0 for r in dp]
                xs, ys = [r["epsilon"] for r in dp], [r["eval"][metric] for r in dp]
                ax.errorbar(xs, ys, yerr=sd, fmt="o-", capsize=3, label=text)
        sweep = [r for r in mine if r["kind"] == "sweep"]
        for r in sweep:
            ax.plot([r["epsilon"]], [r["eval"][metric]], "s", label=f"DP ε=3, batch {r['batch']}")
        for kind, style in (("base", ":"), ("control", "--")):
            for r in mine:
                if r["kind"] == kind:
                    ax.axhline(r["eval"][metric], linestyle=style, color="grey", label=r["name"])
        ax.set_xscale("log")
        ax.set_xlabel("ε (δ = 1e-5, row level)")
        ax.set_ylabel(label)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def toy_model(folder: Path) -> Path:
    """The tiny random chat model of ``scripts/chat_compare.py --toy`` (ChatML template), written to ``folder``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("chat_compare", ROOT / "scripts" / "chat_compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.toy_model(folder)


def model_section_for(settings: Settings, model_path: str | None, folder: Path) -> dict | None:
    """The runs' ``model`` section: the toy model written to ``folder / "toy-model"`` (--toy), ``--model-path``, or
    None (the packaged model)."""
    if settings.toy:
        return {"path": str(toy_model(folder / "toy-model"))}
    return {"path": model_path} if model_path else None


BANKING_COLUMNS = {"prompt_column": "text", "response_column": "category"}  # prompt -> intent label
BITEXT_COLUMNS = {"record_format": "messages", "messages_column": "messages"}  # one-exchange conversations


def device_label(threads: int) -> str:
    """The device the runs train and score on: the GPU's name, or the CPU and its thread count."""
    import torch

    if torch.cuda.is_available():
        return f"GPU {torch.cuda.get_device_name(0)}"
    return f"CPU, {threads} threads"


# --- the study (issue 43): one Bitext DP row at ε = 8 per call, the --cpu preset with only the named levers changed ---
# Today's --cpu rows (docs/utility.md, 2026-12-02) are the FIXED reference of every share: base and control are not
# trained again. Validation: the next STUDY_VALIDATION_ROWS training rows after the first N = 1,600 (rows the
# training never sees and that are not the held-out rows), so N stays 1,600; settings are chosen on it.
STUDY_REFERENCE = {
    "base": 3.0793,
    "control": 1.4329,
    "dp_eps8": 2.2804,
    "source": "docs/utility.md, --cpu table (2026-12-02): Bitext N 1,600, base, control and DP-planner at ε = 8",
}
STUDY_EPSILON = 8.0
STUDY_VALIDATION_ROWS = 200
# lever name → (what it changes in the Bitext task, one line for the table)
STUDY_LEVERS: dict[str, tuple[dict, str]] = {
    "none": ({}, "today's row (r 8 on q,v, E 1)"),
    "rank2": ({"r": 2}, "LoRA r 2 on q,v"),
    "rank1-all": ({"r": 1, "targets": ("all-linear",)}, "LoRA r 1 on all linear layers"),
    "rank4": ({"r": 4}, "LoRA r 4 on q,v"),
    "v-only": ({"targets": ("v_proj",)}, "LoRA r 8 on v only"),
    "ffa": ({"freeze_a": True}, "FFA-LoRA: A frozen at init, B trained (Sun et al., ICLR 2024)"),
    "epochs3": ({"epochs": 3.0}, "E 3 epochs (planner's B, T and sqrt(B) lr)"),
    "epochs5": ({"epochs": 5.0}, "E 5 epochs (planner's B, T and sqrt(B) lr)"),
    # the learning rate (the planner's reference at B = 32, scaled by sqrt(B/32) as before)
    "lr-x3": ({"lr": 0.006}, "lr 0.006 (3x the reference 0.002)"),
    "lr-x0.5": ({"lr": 0.001}, "lr 0.001 (half the reference 0.002)"),
    "lr-x0.25": ({"lr": 0.0005}, "lr 0.0005 (a quarter of the reference 0.002)"),
    "lr-x6": ({"lr": 0.012}, "lr 0.012 (6x the reference 0.002)"),
    "lr-x10": ({"lr": 0.02}, "lr 0.02 (10x the reference 0.002)"),
    "lr-x20": ({"lr": 0.04}, "lr 0.04 (20x the reference 0.002)"),
    # DP-AdamBC (Tang, Shpilevskiy and Lécuyer, AAAI 2024): Φ = (σC/E)² from the planned E, γ = 1e-8
    "adambc": ({"optimizer": "dp_adambc"}, "DP-AdamBC: Adam with the noise variance removed from v (AAAI 2024)"),
    # privacy.clipping: normalize (every unit's vector scaled to C·g/(‖g‖ + 0.01·C): automatic clipping, Bu et al.
    # 2023) and the clipping norm C (0.1 in every other row; the σC noise scales with it)
    "normalize": ({"clipping": "normalize"}, "clipping: normalize (automatic clipping, Bu et al. 2023), C 0.1"),
    "clip-0.03": ({"clip": 0.03}, "C 0.03 (0.3x the reference 0.1)"),
    "clip-0.3": ({"clip": 0.3}, "C 0.3 (3x the reference 0.1)"),
    # the demo's hand B = 32 and lr 0.002 (HAND) at E = 3: T = 150 at the σ the accountant gives for them
    "epochs3-b32": ({"epochs": 3.0, "arm": "hand"}, "E 3 epochs at B 32, lr 0.002 (T 150)"),
    # a public warm start (data.public_warm_start; Li et al. 2022, Yu et al. 2022): the adapter fitted without noise
    # on a PUBLIC corpus, then the same DP row from those weights, no ε charged for it. Never a split of Bitext or
    # Banking77 (issue 49): generated demo tickets (out of distribution) or TWCS tweet pairs (another real corpus,
    # closer in domain). Settings: WARM_START
    "warm-demo": (
        {"warm_start": "demo"},
        "public warm start on generated demo tickets (out of distribution): 100 AdamW steps of 8 at lr 1e-3, no noise",
    ),
    "warm-twcs": (
        {"warm_start": "twcs"},
        "public warm start on TWCS tweet pairs (another corpus): 100 AdamW steps of 8 at lr 1e-3, no noise",
    ),
    # the non-private control (privacy.enabled: false) at the same planner B, T and lr as its DP twin: with other
    # levers, the control a new default would be compared against
    "control": ({"enabled": False}, "non-private control (no clip, no noise; ε = ∞) at the DP twin's B, T, lr"),
}
# The noise–compute frontier (Sander et al. 2023; McKenna et al. 2025; Panda et al. 2024): an explicit expected batch
# B and epochs E (T = ceil(E·N/B), past the planner's B ≤ N/4 and T ≥ 50), lr = lr_ref·sqrt(B/32) as the planner
# scales it. "q1" is B = N (q = 1: the Gaussian mechanism, every unit in every step). B 192 at E 20 is the planner's
# own choice for Banking77 (N 554, ε 8) at E 20 under the step floor of 50 (T 58): the row that tells a floor of 50
# from one of 40 (B 277, T 40).
for _b, _e in ((32, 10), (277, 20), (192, 20), (256, 5), (512, 5), (800, 5), (256, 10), (512, 10), (800, 20)):
    STUDY_LEVERS[f"b{_b}-e{_e}"] = ({"arm": "explicit", "batch": _b, "epochs": float(_e)}, f"B {_b}, E {_e}")
for _e in (10, 20, 50):
    STUDY_LEVERS[f"q1-e{_e}"] = ({"arm": "explicit", "batch": 0, "epochs": float(_e)}, f"q = 1 (B = N), E {_e}")
STUDY_NOT_TASK = (
    "arm",
    "enabled",
)  # lever keys that are not Task fields: the contract's arm (planner or hand B and lr)


# The warm start's settings (Settings.warm_start; --toy: 4 steps of 4). 100 steps of 8 records = 800 public records,
# one pass over the 800 demo tickets, 800 of the 2,083 TWCS pairs: enough noise-free steps to fit the format
# of a support reply (the chat template's assistant turn, greeting and sign-off) without training the adapter into
# another corpus's content; lr 1e-3 is half the DP reference (0.002 at B = 32), since a noise-free step needs no
# larger rate (docs/contract.md, data.public_warm_start.lr).
WARM_START_SOURCES = {
    "demo": "dplora.data.public.demo_rows: {n} generated demo tickets (seed {seed}), as one-exchange conversations",
    "twcs": "TWCS twcs_first5000.csv: {n} (customer tweet -> first brand reply) pairs (dplora.data.twcs, mentions "
    "redacted), as one-exchange conversations",
}


def warm_start_file(source: str, settings: Settings, contract, tmp: Path) -> tuple[Path, int]:
    """The study's public warm-start file in ``tmp`` with the contract's columns: (path, records).

    ``demo``: ``steps × batch`` tickets of :func:`dplora.data.public.demo_rows` (one pass); ``twcs``: every
    (customer tweet → brand reply) pair of the shared TWCS sample (:func:`dplora.data.twcs.load_twcs_pairs`), each
    mapped onto the contract's columns as ``demo_rows`` maps a ticket (a conversations contract: user → assistant).
    Cells are cut to ``settings.max_chars`` as the task's rows are (toy only). Neither is a split of Bitext or
    Banking77 (issue 49); the TWCS text is written to ``tmp`` only, never printed.

    Raises:
        ValueError: an unknown source.
    """
    from dplora.data.public import demo_rows

    steps, batch, _ = settings.warm_start
    if source == "demo":
        rows = demo_rows(contract.data, contract.privacy, steps * batch)
    elif source == "twcs":
        from dplora.data.twcs import load_twcs_pairs

        rows = [_mapped(contract.data, p["message"], p["reply"]) for p in load_twcs_pairs(TWCS)]
    else:
        raise ValueError(f"unknown warm-start source {source!r}; known: {', '.join(WARM_START_SOURCES)}")
    if settings.max_chars is not None:
        rows = [_cut(r, settings.max_chars) for r in rows]
    path = tmp / f"warm_{source}.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path, len(rows)


def _mapped(data, message: str, reply: str) -> dict:
    """A (message, reply) pair with the contract's columns, as :func:`dplora.data.public.demo_rows` maps a ticket."""
    if data.text_column:
        return {data.text_column: f"{message}\n{reply}"}
    if data.messages_key is not None:
        return {data.messages_key: [{"role": "user", "content": message}, {"role": "assistant", "content": reply}]}
    return {data.prompt_column: message, data.response_column: reply}


def _cut(row: dict, chars: int) -> dict:
    """``row`` with every text (and every turn's content) cut to ``chars`` characters."""
    out = {}
    for key, value in row.items():
        if isinstance(value, list):
            out[key] = [{**turn, "content": turn["content"][:chars]} for turn in value]
        else:
            out[key] = value[:chars] if isinstance(value, str) else value
    return out


def bitext_validation(settings: Settings, count: int) -> list[dict]:
    """The validation conversations of the study: the ``count`` training rows (not held out) right after the first
    ``settings.max_train_rows``, in file order; disjoint from both the trained and the held-out rows.

    Args:
        settings: a preset with ``max_train_rows`` set (the trained rows are the first that many).
        count: validation rows wanted (conversations).
    Returns:
        ``count`` conversation records (``messages``, ``category``), fewer if the file runs out.
    Raises:
        ValueError: ``settings.max_train_rows`` is None (every training row is trained: nothing left).
    Source: the seeded hash split of :func:`bitext_data` (held-out fraction 0.1).
    """
    if settings.max_train_rows is None:
        raise ValueError("the study's validation rows come after max_train_rows: set it")
    rows = _read_csv(BITEXT)
    for r in rows:
        r["response"] = r["response"].replace("\r\n", "\n")
        if settings.max_chars is not None:
            cut = settings.max_chars
            r["instruction"], r["response"] = r["instruction"][:cut], r["response"][:cut]
    train = [r for i, r in enumerate(rows) if not _held_out(i, settings.seed, 0.1)]
    n = settings.max_train_rows
    return [conversation(r) for r in train[n : n + count]]


def study_task(task: Task, levers: list[str]) -> Task:
    """``task`` with the named levers applied (:data:`STUDY_LEVERS`); several levers combine.

    Raises:
        ValueError: an unknown lever, or two levers that set the same field differently.
    """
    changes: dict = {}
    for name in levers:
        if name not in STUDY_LEVERS:
            raise ValueError(f"unknown lever {name!r}; known: {', '.join(STUDY_LEVERS)}")
        for k, v in STUDY_LEVERS[name][0].items():
            if k in changes and changes[k] != v:
                raise ValueError(f"levers set {k} twice: {changes[k]!r} and {v!r}")
            changes[k] = v
    explicit_epochs = [n for n in levers if "epochs" in STUDY_LEVERS[n][0] and "arm" not in STUDY_LEVERS[n][0]]
    if changes.get("arm") == "explicit" and explicit_epochs:
        raise ValueError("a frontier lever fixes B and E: it does not combine with an epochs lever")
    if changes.get("arm") == "hand" and "lr" in changes:
        raise ValueError("a hand-settings lever fixes lr 0.002: it does not combine with an lr lever")
    return dataclasses.replace(task, **{k: v for k, v in changes.items() if k not in STUDY_NOT_TASK})


def study_arm(levers: list[str]) -> str:
    """The contract arm of a study row: ``hand`` (:data:`HAND`'s B and lr) when a lever asks for it, else
    ``planner`` (the planner's B, T and √B lr rule, as today's row)."""
    arms = {STUDY_LEVERS[n][0].get("arm", "planner") for n in levers}
    return "hand" if "hand" in arms else "explicit" if "explicit" in arms else "planner"


BANKING_STUDY_REFERENCE = {
    "base": 0.483,
    "control": 0.950,
    "dp_eps8": 0.683,
    "metric": "accuracy",
    "source": "docs/utility.md, --cpu table (2026-12-02): Banking77 N 554, base, control and DP-planner at ε = 8",
}
BANKING_NONE = "today's row (r 8 on q,v, E 3)"  # the --cpu preset's Banking77 task trains 3 epochs
STUDY_VALIDATION_PER_INTENT = 20  # Banking77 validation: unused test rows per intent (after the reported ones)


def banking_validation(settings: Settings, per_intent: int) -> list[dict]:
    """The Banking77 study's validation rows: per intent, the ``per_intent`` test rows right after the
    ``settings.banking.eval_rows`` that are reported (file order). Never trained on (they are test rows) and never
    reported; drawn from the test split because the --cpu preset trains every training row of two of its five
    intents (N = 3·120 + 112 + 82), so a training-side split would leave those intents out.

    Returns:
        Up to ``per_intent`` rows (``text``, ``category``) per intent, fewer where the split runs out.
    """
    test = _read_csv(BANKING / "test.csv")
    labels = list(settings.intents or json.loads((BANKING / "categories.json").read_text()))
    first, out = settings.banking.eval_rows, []
    for label in labels:
        out += [r for r in test if r["category"] == label][first : first + per_intent]
    return out


def study_share(loss: float, reference: dict = STUDY_REFERENCE) -> float:
    """Share of the control's gain kept by a DP row: (base − loss)/(base − control), on the fixed reference rows.

    Args:
        loss: held-out loss per target token (nats) of the DP row.
        reference: ``base`` and ``control`` held-out losses (nats per target token).
    Returns:
        The share (1 = all of the control's gain, 0 = none, negative = worse than base).
    """
    if reference.get("metric") == "accuracy":  # Banking77: (accuracy − base)/(control − base)
        return (loss - reference["base"]) / (reference["control"] - reference["base"])
    return (reference["base"] - loss) / (reference["base"] - reference["control"])


def trained_parameters(folder: Path, freeze_a: bool) -> int:
    """LoRA weights the run trained (count), read from its released adapter: every ``lora_A``/``lora_B`` tensor,
    or the ``lora_B`` ones only when A was frozen (FFA-LoRA)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(Path(folder) / "adapter" / "adapter_model.safetensors"), framework="pt") as fh:
        for k in fh.keys():
            if "lora_B" in k or ("lora_A" in k and not freeze_a):
                total += math.prod(fh.get_slice(k).get_shape())
    return total


def study_row(
    levers: list[str],
    settings: Settings,
    out: Path,
    threads: int,
    model_path: str | None,
    task_name: str = "bitext",
    epsilon: float = STUDY_EPSILON,
) -> dict:
    """Train one DP row at ε (default 8) with the levers applied and score it on held-out and validation rows: Bitext
    (loss per target token) or, with ``task_name="banking77"``, Banking77 (accuracy; :func:`banking_validation`).
    The share is always against the fixed ε = 8 reference's base and control (the control has no ε)."""
    from dplora.contract.loader import parse_contract
    from dplora.release.keys import generate_keypair

    banking = task_name == "banking77"
    started = time.perf_counter()
    task = study_task(settings.banking if banking else settings.bitext, levers)
    name = ("study-banking77-" if banking else "study-") + "+".join(levers)
    if epsilon != STUDY_EPSILON:
        name += f"-eps{epsilon:g}"
    # A row at E 20 takes hours on one core, longer than a working session: the row's data, key, ledger and cache
    # live in a stable folder under --out (never a temporary one), so that running the same command again resumes
    # the killed run from its checkpoint (the contract, data and ledger are the same files), and the folder goes
    # only when the row is scored.
    tmp = out / "work" / name
    tmp.mkdir(parents=True, exist_ok=True)
    isolate_user_state(tmp)
    key = tmp / "bench.key"
    if not key.exists():
        key, _ = generate_keypair(key, None, overwrite=False)
    if banking:
        path, held, labels = banking_data(settings, tmp)
        val = banking_validation(settings, STUDY_VALIDATION_PER_INTENT)
        columns = BANKING_COLUMNS
    else:
        (path, held), labels = bitext_data(settings, tmp), None
        val = bitext_validation(settings, STUDY_VALIDATION_ROWS)
        columns = BITEXT_COLUMNS
    model_section = model_section_for(settings, model_path, out)
    scorer = Scorer(threads, model_section)
    contract = parse_contract(contract_for(task, settings, path, columns, tmp / "unused", model=model_section))

    def score(model, rows: list[dict]) -> dict:
        if banking:
            return banking_eval(scorer, model, rows, labels, contract)
        return bitext_eval(scorer, model, rows, contract)

    base_held, base_val = score(scorer.base, held), score(scorer.base, val)
    folder = out / "runs" / name
    kw = {"model": model_section, "arm": study_arm(levers), "epsilon": epsilon}
    warm = None
    if task.warm_start is not None:  # the public file, then the same contract with data.public_warm_start
        warm_path, warm_records = warm_start_file(task.warm_start, settings, contract, tmp)
        steps, batch, lr = settings.warm_start
        kw["warm"] = {"path": str(warm_path), "steps": steps, "batch_size": batch, "lr": lr}
        warm = {"source": task.warm_start, "records": warm_records, "steps": steps, "batch_size": batch, "lr": lr}
    if any(STUDY_LEVERS[n][0].get("enabled") is False for n in levers):  # the control: its DP twin's B, T, lr
        twin = contract_for(task, settings, path, columns, folder, **kw)
        kw |= {"arm": "fixed", "fixed": resolved_settings(twin), "enabled": False}
    raw = contract_for(task, settings, path, columns, folder, **kw)
    run = train_one(raw, key, threads)
    if warm is not None:  # what the signed record says of the public file (its sha256 names the exact rows)
        from dplora.data.public import DEMO_SEED
        from dplora.release.read import read_statement

        entry = read_statement(Path(run["folder"]) / "release.dsse.json")["predicate"]["public_warm_start"]
        described = WARM_START_SOURCES[warm["source"]].format(n=warm["records"], seed=DEMO_SEED)
        warm |= {"sha256": entry["sha256"], "described": described}
    model = scorer.model(run["folder"])
    held_eval, val_eval = score(model, held), score(model, val)
    scorer.release(model)
    shutil.rmtree(tmp, ignore_errors=True)
    row = {
        "task": task_name,
        "levers": list(levers),
        "changes": [BANKING_NONE if banking and n == "none" else STUDY_LEVERS[n][1] for n in levers]
        + ([f"target ε {epsilon:g} (not 8)"] if epsilon != STUDY_EPSILON else []),
        "epsilon": epsilon,
        "arm": study_arm(levers),
        "lora": raw["lora"],
        "epochs": task.epochs,
        "trained_parameters": trained_parameters(Path(run["folder"]), task.freeze_a),
        **({"warm_start": warm} if warm is not None else {}),
        **{k: run[k] for k in ("batch", "steps", "q", "sigma", "lr", "epsilon_spent", "train_seconds", "s_per_step")},
        **({"resumed": "from a checkpoint: seconds and minutes count the last part"} if run["resumed"] else {}),
    }
    if banking:
        row |= {
            "test_accuracy": round(held_eval["accuracy"], 4),
            "test_rows": held_eval["records"],
            "share_of_control_gain": round(study_share(held_eval["accuracy"], BANKING_STUDY_REFERENCE), 4),
            "validation_accuracy": round(val_eval["accuracy"], 4),
            "validation_rows": val_eval["records"],
            "base_validation_accuracy": round(base_val["accuracy"], 4),
            "base_test_accuracy": round(base_held["accuracy"], 4),  # must reproduce the reference's base
            # length-normalised scoring (a diagnostic; the share stays on the summed scoring's fixed reference)
            "test_accuracy_per_token": round(held_eval["accuracy_per_token"], 4),
            "base_test_accuracy_per_token": round(base_held["accuracy_per_token"], 4),
            # the classification path (calibrated, per token) and its per-intent recall on the test rows
            "test_accuracy_calibrated": round(held_eval["accuracy_calibrated"], 4),
            "base_test_accuracy_calibrated": round(base_held["accuracy_calibrated"], 4),
            "validation_accuracy_calibrated": round(val_eval["accuracy_calibrated"], 4),
            "test_recall": {k: round(v, 4) for k, v in held_eval["per_label_recall"].items()},  # calibrated
            "test_recall_per_token": {k: round(v, 4) for k, v in held_eval["per_label_recall_per_token"].items()},
        }
    else:
        row |= {
            "heldout_loss": round(held_eval["loss"], 4),
            "heldout_rows": held_eval["records"],
            "share_of_control_gain": round(study_share(held_eval["loss"]), 4),
            "validation_loss": round(val_eval["loss"], 4),
            "validation_rows": val_eval["records"],
            "base_validation_loss": round(base_val["loss"], 4),
            "base_heldout_loss": round(base_held["loss"], 4),  # must reproduce the reference's base
        }
    return row | {
        "wall_minutes": round((time.perf_counter() - started) / 60, 1),
        "hardware": device_label(threads),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "reference": BANKING_STUDY_REFERENCE if banking else STUDY_REFERENCE,
        "groups": held_eval["groups"],
    }


def _eps_cell(spent) -> str:
    """ε spent in the study table: 3 decimals, or ∞ for the non-private control (``None`` in its row)."""
    return "∞" if spent is None else f"{spent:.3f}"


STUDY_START = "<!-- study (issue 43): rows from docs/utility-study.json, written by utility_bench.py --study -->"
STUDY_END = "<!-- /study -->"


BANKING_STUDY_START = "<!-- study banking77 (issue 43): rows from docs/utility-study-banking77.json -->"
BANKING_STUDY_END = "<!-- /study banking77 -->"


def _banking_table_md(rows: list[dict]) -> str:
    ref = rows[0]["reference"] if rows else BANKING_STUDY_REFERENCE
    lines = [
        "| levers | change | trained d | B | T | σ | ε spent | validation accuracy (base) | test accuracy | share "
        "| test accuracy, calibrated (base) | train min | wall min |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| reference | today's DP-planner row (not retrained) | 460,800 | 32 | 52 | — | ≤ 8 | — | "
        f"{ref['dp_eps8']:.3f} | {study_share(ref['dp_eps8'], ref):.3f} | — | — | — |",
    ]
    for r in rows:
        calibrated = "—"  # rows scored before the classification path was in the benchmark
        if "test_accuracy_calibrated" in r:
            calibrated = f"{r['test_accuracy_calibrated']:.3f} ({r['base_test_accuracy_calibrated']:.3f})"
        lines.append(
            f"| {'+'.join(r['levers'])} | {'; '.join(r['changes'])} | {r['trained_parameters']:,} | {r['batch']} | "
            f"{r['steps']} | {r['sigma']:.3f} | {_eps_cell(r['epsilon_spent'])} | {r['validation_accuracy']:.3f} "
            f"({r['base_validation_accuracy']:.3f}) | {r['test_accuracy']:.3f} | {r['share_of_control_gain']:.3f} | "
            f"{calibrated} | {r['train_seconds'] / 60:.1f} | {r['wall_minutes']:.1f} |"
        )
    return "\n".join(lines)


def study_table_md(rows: list[dict]) -> str:
    """The study's table (markdown): one line per row of the study's JSON, today's reference first (Bitext, or
    Banking77 when the rows are ``task: banking77``)."""
    if rows and rows[0].get("task") == "banking77":
        return _banking_table_md(rows)
    ref = rows[0]["reference"] if rows else STUDY_REFERENCE
    lines = [
        "| levers | change | trained d | B | T | σ | ε spent | validation loss (base) | held-out loss | share "
        "| train min | wall min |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| reference | today's DP-planner row (not retrained) | 460,800 | 32 | 50 | 0.500 | ≤ 8 | — | "
        f"{ref['dp_eps8']:.4f} | {study_share(ref['dp_eps8'], ref):.3f} | — | 47.4 |",
    ]
    for r in rows:
        lines.append(
            f"| {'+'.join(r['levers'])} | {'; '.join(r['changes'])} | {r['trained_parameters']:,} | {r['batch']} | "
            f"{r['steps']} | {r['sigma']:.3f} | {_eps_cell(r['epsilon_spent'])} | {r['validation_loss']:.4f} "
            f"({r['base_validation_loss']:.4f}) | {r['heldout_loss']:.4f} | {r['share_of_control_gain']:.3f} | "
            f"{r['train_seconds'] / 60:.1f} | {r['wall_minutes']:.1f} |"
        )
    return "\n".join(lines)


def rescore_banking(folders: list[Path], settings: Settings, threads: int, model_path: str | None = None) -> dict:
    """Test accuracy of the base model and of each released folder (its ``adapter/``) on the study's Banking77 test
    rows, under both scorings of :func:`banking_eval`: ``{"base": {...}, "<folder>": {...}}``, each with
    ``accuracy``, ``accuracy_per_token`` and the per-intent correct counts. Public benchmark rows only.

    Raises:
        FileNotFoundError: a folder without ``adapter/``.
    """
    from dplora.contract.loader import parse_contract

    for folder in folders:
        if not (folder / "adapter").is_dir():
            raise FileNotFoundError(f"{folder}: no adapter/ folder (give a released run folder)")
    with tempfile.TemporaryDirectory(prefix="dplora-rescore-") as tmp_name:
        tmp = Path(tmp_name)
        path, held, labels = banking_data(settings, tmp)
        model_section = model_section_for(settings, model_path, tmp)
        scorer = Scorer(threads, model_section)
        contract = parse_contract(
            contract_for(settings.banking, settings, path, BANKING_COLUMNS, tmp / "o", model=model_section)
        )

        def summary(model) -> dict:
            got = banking_eval(scorer, model, held, labels, contract)
            keep = ("accuracy", "accuracy_per_token", "accuracy_calibrated", "records")
            return {k: round(got[k], 4) for k in keep} | {
                "correct_by_intent": {g["group"]: round(g["accuracy"] * g["records"]) for g in got["groups"]},
                "recall_calibrated": {k: round(v, 4) for k, v in got["per_label_recall"].items()},
                "recall_per_token": {k: round(v, 4) for k, v in got["per_label_recall_per_token"].items()},
            }

        report = {"base": summary(scorer.base)}
        for folder in folders:
            model = scorer.model(str(folder))
            report[str(folder)] = summary(model)
            scorer.release(model)
    return report


def write_study(row: dict, json_path: Path, md_path: Path) -> list[dict]:
    """Append ``row`` to the study's JSON (a list of rows) and rewrite the table between the markers of
    ``md_path`` (a "Study (issue 43)" section is appended when the markers are missing); returns every row."""
    rows = json.loads(json_path.read_text()) if json_path.exists() else []
    rows.append(row)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
    text = md_path.read_text() if md_path.exists() else ""
    banking = row.get("task") == "banking77"
    start, end = (BANKING_STUDY_START, BANKING_STUDY_END) if banking else (STUDY_START, STUDY_END)
    title = "## Study on Banking77 (issue 43)" if banking else "## Study (issue 43)"
    block = f"{start}\n{study_table_md(rows)}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + f"{title}\n\n" + block + "\n"
    md_path.write_text(text)
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="CPU-sized: 5 intents, short sequences (< 30 min, 2 cores)")
    mode.add_argument(
        "--full", action="store_true", help="all 77 intents, all rows: base, control, DP-planner, DP-hand (a GPU)"
    )
    mode.add_argument("--cpu", action="store_true", help="the --full design cut to about 2.5 h on 2 CPU cores")
    ap.add_argument(
        "--toy", action="store_true", help="a tiny random chat model (seconds; tests); with --full: its design"
    )
    ap.add_argument(
        "--out",
        type=Path,
        help="output folder (utility.json, utility.md, utility.png); required but with --rescore-banking77",
    )
    ap.add_argument("--threads", type=int, default=2, help="torch threads (per task with --jobs)")
    ap.add_argument(
        "--jobs", type=int, default=1, help="tasks run at once, each in its own process (--cpu: use 2 on 2 cores)"
    )
    ap.add_argument("--only", choices=("banking77", "bitext"), help="run one task only")
    ap.add_argument("--repeats", type=int, help="trainings per row (--full: 3, --cpu: 1)")
    ap.add_argument("--epsilons", type=float, nargs="+", help="ε of the DP rows (--full: 1 3 8)")
    ap.add_argument("--max-train-rows", type=int, help="training rows kept per task, in file order")
    ap.add_argument(
        "--max-steps", type=int, help="cap T of every run at this many steps (the GPU check's dry run: seconds)"
    )
    ap.add_argument("--model-path", help="a local Hugging Face model folder instead of the packaged SmolLM2-135M")
    ap.add_argument(
        "--study",
        nargs="+",
        choices=tuple(STUDY_LEVERS),
        help="issue 43: train ONE DP row at ε = 8 (the --cpu preset, or --toy) with these levers changed: Bitext, or "
        "Banking77 with --only banking77",
    )
    ap.add_argument(
        "--study-epsilon",
        type=float,
        default=STUDY_EPSILON,
        help="the study row's target ε (default 8; the share stays on the ε = 8 reference's base and control)",
    )
    ap.add_argument("--study-json", type=Path, help="the study's rows (default docs/utility-study.json; --toy: OUT)")
    ap.add_argument("--study-md", type=Path, help="the page its table goes in (default docs/utility.md; --toy: OUT)")
    ap.add_argument(
        "--rescore-banking77",
        type=Path,
        nargs="+",
        metavar="RELEASE",
        help="score the base and these released folders on the --cpu Banking77 test rows, summed and per-token",
    )
    args = ap.parse_args(argv)
    if args.rescore_banking77:
        report = rescore_banking(args.rescore_banking77, TOY_FULL if args.toy else CPU, args.threads, args.model_path)
        print(json.dumps(report, indent=2))
        return report
    if args.out is None:
        ap.error("--out is required (but with --rescore-banking77)")
    if args.study:
        if args.quick or args.full:
            ap.error("--study runs the --cpu preset (or --toy): drop --quick/--full")
        settings = TOY_FULL if args.toy else CPU
        args.out.mkdir(parents=True, exist_ok=True)
        task_name = args.only or "bitext"
        row = study_row(args.study, settings, args.out, args.threads, args.model_path, task_name, args.study_epsilon)
        docs = args.out if args.toy else ROOT / "docs"
        default_json = "utility-study-banking77.json" if task_name == "banking77" else "utility-study.json"
        json_path = args.study_json or docs / default_json
        md_path = args.study_md or docs / "utility.md"
        write_study(row, json_path, md_path)
        print(json.dumps({k: v for k, v in row.items() if k not in ("groups", "reference")}, indent=2))
        return row
    if not (args.quick or args.full or args.cpu or args.toy):
        ap.error("one of --quick, --full, --cpu or --toy is required")
    if args.toy and (args.quick or args.cpu):
        ap.error("--toy combines with --full only")
    if args.toy and args.model_path:
        ap.error("--toy builds its own model: drop --model-path")
    if args.repeats is not None and args.repeats < 1:
        ap.error("--repeats must be ≥ 1")
    if args.repeats is not None and not (args.full or args.cpu):
        ap.error("--repeats applies to --full and --cpu (the planner design)")
    settings = (TOY_FULL if args.full else TOY) if args.toy else QUICK if args.quick else CPU if args.cpu else FULL
    mode_name = "quick" if args.quick else "cpu" if args.cpu else "full" if args.full else "toy"
    mode_name = f"toy-{mode_name}" if args.toy and args.full else mode_name
    override = {"repeats": args.repeats, "max_train_rows": args.max_train_rows}
    if args.epsilons:
        override["epsilons"] = tuple(args.epsilons)
        if settings.hand_epsilons is not None:
            override["hand_epsilons"] = tuple(e for e in settings.hand_epsilons if e in args.epsilons)
    settings = dataclasses.replace(settings, **{k: v for k, v in override.items() if v is not None})
    if args.max_steps is not None:
        if args.max_steps < 1:
            ap.error("--max-steps must be ≥ 1")
        capped = {t: dataclasses.replace(getattr(settings, t), max_steps=args.max_steps) for t in ("banking", "bitext")}
        settings = dataclasses.replace(settings, **capped)
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    selected = [args.only] if args.only else [t for t in ("banking77", "bitext") if t in settings.tasks]
    if args.jobs > 1 and len(selected) > 1:
        rows, model_section = _parallel_tasks(argv if argv is not None else sys.argv[1:], selected, args.out)
        return _report(rows, settings, mode_name, model_section, args, started)
    from dplora.contract.loader import parse_contract
    from dplora.release.keys import generate_keypair

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="dplora-utility-") as tmp_name:
        tmp = Path(tmp_name)
        isolate_user_state(tmp)
        key, _ = generate_keypair(tmp / "bench.key", None, overwrite=False)
        bank_path, bank_test, labels = banking_data(settings, tmp)
        bitext_path, bitext_held = bitext_data(settings, tmp)
        tasks = [
            (settings.banking, bank_path, BANKING_COLUMNS),
            (settings.bitext, bitext_path, BITEXT_COLUMNS),
        ]
        model_section = model_section_for(settings, args.model_path, args.out)
        scorer = Scorer(args.threads, model_section)
        for task, path, columns in tasks:
            if (task.name != args.only) if args.only else (task.name not in settings.tasks):
                continue
            base_raw = contract_for(task, settings, path, columns, tmp / "unused", model=model_section)
            base_contract = parse_contract(base_raw)

            def evaluate(model, task=task, contract=base_contract):
                if task.name == "banking77":
                    return banking_eval(scorer, model, bank_test, labels, contract)
                return bitext_eval(scorer, model, bitext_held, contract)

            t0 = time.perf_counter()
            rows.append({"task": task.name, "name": "base", "kind": "base", "eval": evaluate(scorer.base)})
            rows[-1]["eval_seconds"] = round(time.perf_counter() - t0, 1)
            rows[-1]["minutes"] = round(rows[-1]["eval_seconds"] / 60, 2)
            _say(rows[-1], started)
            fixed = None
            done: dict[str, dict] = {}
            for spec in run_specs(task, settings):
                if spec.get("arm") == "fixed" and fixed is None:  # the planner's B and T at the control's ε
                    planner_raw = contract_for(
                        task, settings, path, columns, tmp / "unused", model=model_section, **spec | {"arm": "planner"}
                    )
                    fixed = resolved_settings(planner_raw | {"privacy": planner_raw["privacy"] | {"enabled": True}})
                twin = _same_settings_row(spec, done, task, settings, path, columns, tmp, model_section)
                if twin is not None:
                    rows.append(twin)
                    _say(twin, started)
                    continue
                runs = []
                for i in range(settings.repeats if settings.design == "planner" else 1):
                    suffix = f"-r{i}" if settings.design == "planner" else ""
                    out = args.out / "runs" / f"{task.name}-{spec['name']}{suffix}"
                    raw = contract_for(task, settings, path, columns, out, model=model_section, fixed=fixed, **spec)
                    run = {"task": task.name, **spec, **train_one(raw, key, args.threads)}
                    t0 = time.perf_counter()
                    model = scorer.model(run["folder"])
                    run["eval"] = evaluate(model)
                    scorer.release(model)
                    run["eval_seconds"] = round(time.perf_counter() - t0, 1)
                    runs.append(run)
                if settings.design == "planner":
                    row = {"task": task.name, **{k: v for k, v in spec.items() if k != "arm"}} | aggregate(runs)
                else:
                    row = runs[0]
                rows.append(row)
                done[spec["name"]] = row
                _say(row, started)
    return _report(rows, settings, mode_name, model_section, args, started)


def _parallel_tasks(argv: list[str], tasks: list[str], out: Path) -> tuple[list[dict], dict | None]:
    """Run each task as ``--only TASK`` in its own process at once (``--jobs``); their rows, in task order."""
    import subprocess

    rest = child_argv(argv)
    procs = [
        subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *rest, "--only", t, "--out", str(out / t)])
        for t in tasks
    ]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a task's process failed (exit codes {codes}); its output is above")
    rows, model = [], None
    for t in tasks:
        report = json.loads((out / t / "utility.json").read_text())
        rows += report["rows"]
        model = report["model"]
    return rows, model


def child_argv(argv: list[str]) -> list[str]:
    """``argv`` without ``--jobs`` and ``--out`` (and their values): what each task's process is given."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--jobs", "--out"):
            skip = True
        elif not a.startswith(("--jobs=", "--out=")):
            rest.append(a)
    return rest


def _report(rows, settings, mode_name, model_section, args, started) -> dict:
    """utility.json, utility.md and utility.png in ``args.out`` from the rows; returns the report."""
    minutes = (time.perf_counter() - started) / 60
    planner = settings.design == "planner"
    share = shares(rows) if planner else {}
    dp3 = "dp-planner-eps3" if planner else "dp-eps3"
    report = {
        "mode": mode_name,
        "label": settings.label,
        "settings": dataclasses.asdict(settings) | ({"hand": HAND} if planner else {}),
        "hardware": device_label(args.threads) + (f" × {args.jobs} tasks at once" if args.jobs > 1 else ""),
        "model": (model_section or {"name": "smollm2-135m"}),
        "minutes": round(minutes, 1),
        "rows": rows,
        "worst_groups": {
            "banking77": worst_groups(rows, "banking77", "accuracy", dp_name=dp3),
            "bitext": worst_groups(rows, "bitext", "loss", dp_name=dp3),
        },
        "share_of_control_gain": share,
        "goal": goal_full(rows, share) if planner else goal(rows),
    }
    title = f"# Utility benchmark ({report['mode']}, {report['hardware']}, {minutes:.1f} min)"
    md = [title, "", *([settings.label, ""] if settings.label else [])]
    md += [table_full_md(rows, share) if planner else table_md(rows), ""]
    if planner:
        md += [
            "Share of the control's gain: (base − dp)/(base − control) for Bitext loss, (dp − base)/(control − base) "
            "for Banking77 accuracy. Control: non-private at the planner's B, T, lr and schedule at the largest ε. "
            f"Hand: B = {HAND['expected_batch_size']}, lr {HAND['lr']} (configs/demo.yaml), same epochs. "
            "Last checkpoint of every run; no selection on held-out data.",
            "",
        ]
    md += ["## Groups DP at ε = 3 hurts most (against the control)", ""]
    for name, groups in report["worst_groups"].items():
        for g in groups:
            md.append(
                f"- {name} `{g['group']}` ({g['records']} records): control {g['control']:.3f}, "
                f"DP ε=3 {g['dp_eps3']:.3f}"
            )
    md += ["", "## Goal", "", "```", json.dumps(report["goal"], indent=2), "```", ""]
    try:
        plot(rows, args.out / "utility.png")
        report["plot"] = "utility.png"
    except ImportError:  # matplotlib is optional
        report["plot"] = None
        md += ["(no plot: matplotlib is not installed)", ""]
    (args.out / "utility.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "utility.md").write_text("\n".join(md))
    print("\n".join(md))
    return report


def _same_settings_row(spec, done, task, settings, path, columns, tmp, model_section) -> dict | None:
    """For a DP-hand spec: the DP-planner row at the same ε when both contracts resolve to the same B, T, lr,
    schedule and warmup (same ε, δ, accountant, data and LoRA otherwise), relabelled; else None (train it)."""
    if spec.get("arm") != "hand":
        return None
    twin = done.get(f"dp-planner-eps{spec['epsilon']:g}")
    if twin is None:
        return None
    unused = tmp / "unused"
    hand = contract_for(task, settings, path, columns, unused, model=model_section, **spec)
    planner = contract_for(task, settings, path, columns, unused, model=model_section, **spec | {"arm": "planner"})
    if resolved_settings(hand) != resolved_settings(planner):
        return None
    return twin | {"name": spec["name"], "kind": spec["kind"], "same_as": twin["name"]}


def goal(rows: list[dict]) -> dict:
    """The issue's goal at ε = 3: Banking77 within 3 points and Bitext loss within 5 % of the control, counted
    only where the control beats the base model (Banking77 by ≥ 20 points)."""
    out = {}
    by = {(r["task"], r["name"]): r["eval"] for r in rows}
    if ("banking77", "dp-eps3") in by:
        base, ctrl, dp = (by[("banking77", n)]["accuracy"] for n in ("base", "non-private", "dp-eps3"))
        out["banking77"] = {
            "control_minus_base_points": round(100 * (ctrl - base), 1),
            "control_minus_dp_eps3_points": round(100 * (ctrl - dp), 1),
            "counts": ctrl - base >= 0.20,
            "met": ctrl - base >= 0.20 and ctrl - dp <= 0.03,
        }
    if ("bitext", "dp-eps3") in by:
        base, ctrl, dp = (by[("bitext", n)]["loss"] for n in ("base", "non-private", "dp-eps3"))
        out["bitext"] = {
            "control_gain_over_base": round(base - ctrl, 4),
            "dp_eps3_over_control_percent": round(100 * (dp / ctrl - 1), 2),
            "counts": ctrl < base,
            "met": ctrl < base and dp <= 1.05 * ctrl,
        }
    return out


def _say(row: dict, started: float) -> None:
    e = row["eval"]
    metric = f"acc {e['accuracy']:.3f}" if "accuracy" in e else f"loss {e['loss']:.4f}"
    extra = f", {row['steps']} steps, σ {row['sigma']:.3f}, train {row['train_seconds']} s" if "steps" in row else ""
    print(
        f"[{(time.perf_counter() - started) / 60:5.1f} min] {row['task']} {row['name']}: {metric}{extra}, "
        f"eval {row['eval_seconds']} s",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    main()
