"""Charged hyperparameter tuning: a grid of ``dplora train`` runs, every trial charged, one release for the sweep.

Tuning on private data spends budget (Papernot & Steinke 2022, "Hyperparameter Tuning with Renyi Differential
Privacy"): every trial's adapters depend on the data, and picking the best of them publishes a function of all of
them. ``dplora sweep`` therefore

1. expands ``key=v1,v2`` axes into trials and checks every trial's contract and plan before anything runs (the
   ledger cap must hold the sum of all planned ε and δ);
2. runs each trial through :func:`dplora.recipe.train.run_training`, exactly as ``dplora train`` (no other code path),
   charged to the ledger as a tuning trial (``purpose = "tuning"``) and signed with a throw-away key: a trial is
   not a release;
3. evaluates each trial's adapters on the selection set (a public file, the demo generator, or, not covered by
   DP, a private file or the contract's own held-out set) and keeps the lowest held-out loss;
4. composes all trials' (ε, δ) — basic composition (Dwork & Roth 2014, Thm 3.16) always, and in the accountant
   when it applies (RDP of a composition is the sum of the RDPs, Mironov 2017, Prop. 1; PRV and PLD compose the
   trials' events, Gopi et al. 2021; Doroshenko et al. 2022) at the total δ — and states the smallest total, with
   the attack ceiling of every trial's mechanism composed (the choice and the entry are functions of all trials);
5. re-signs the chosen trial with the user's key: its record (built by :func:`dplora.release.record.build_record` in the
   trial) gains a ``tuning`` entry before it is signed, so the signature covers the total. The other trials'
   folders (adapters, throw-away records) are deleted: nothing of them is released.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import shutil
import tempfile
from pathlib import Path

from dplora import atomic
from dplora.accounting.composition import compose
from dplora.data import digest as digests
from dplora.errors import BadInputError, PlanRefusedError, excerpt
from dplora.recipe.config import RunOptions
from dplora.release.audit_section import tuning_attack_ceiling
from dplora.run import outputs

MAX_TRIALS = 64
SUMMARY_FILENAME = "sweep.json"
# Keys a sweep may not vary: every trial must charge the same population over the same units and relation.
FIXED_KEYS = (
    "privacy.protected_unit",
    "privacy.unit_key",
    "privacy.adjacency",
    "privacy.population",
    "privacy.enabled",
    "data.path",
    "training.output_dir",
)
METRIC = "held-out loss per target token (nats), same masking as training; lowest wins"
NOT_COVERED = (
    "NOT COVERED: the trial was chosen by an evaluation on private data that no accountant charges; the total ε "
    "covers the trials' training, not the choice"
)
COVERED = "covered: the choice used only a public evaluation set and the trials' DP outputs (post-processing)"


class SelectBy(str, enum.Enum):
    """Which held-out set picks the trial."""

    DEMO = "demo"  # the demo generator (public by construction)
    PUBLIC = "public"  # a file the user declares public (--eval-public)
    PRIVATE = "private"  # a private file (--eval-private): not covered
    CONTRACT = "contract"  # the contract's own held-out set: covered only when data.eval_public


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepOptions:
    """The sweep's inputs besides the contract and the grid (paths as given on the command line)."""

    out_dir: Path
    select_by: SelectBy = SelectBy.DEMO
    eval_file: Path | None = None
    eval_tickets: int = 200
    signing_key: Path | None = None
    data_key: Path | None = None
    ledger_path: Path | None = None
    threads: int | None = None
    progress: bool = True
    contract_path: Path | None = None


def split_values(text: str) -> list[str]:
    """``a,b,[c,d]`` → ``["a", "b", "[c,d]"]``: split at commas outside brackets, braces and quotes."""
    parts, depth, quote, cur = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    parts.append(cur)
    return parts


def parse_grid(args: list[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(fixed overrides, axes) from ``KEY=VALUE`` and ``KEY=V1,V2,...`` arguments.

    Raises:
        BadInputError: an argument without ``=``, an empty value, a key given twice, or a key a sweep may not vary.
    """
    fixed, axes, seen = [], [], set()
    for arg in args:
        key, sep, value = arg.partition("=")
        key = key.strip()
        if not sep or not key:
            raise BadInputError(f"{excerpt(arg)}: expected KEY=VALUE or KEY=V1,V2,...")
        if key in seen:
            raise BadInputError(f"{excerpt(key)} is given twice")
        seen.add(key)
        values = split_values(value)
        if any(not v.strip() for v in values):
            raise BadInputError(f"{excerpt(arg)}: an empty value")
        if key == "training.output_dir":
            raise BadInputError("training.output_dir is set by the sweep (--out DIR/trial-NN)")
        if len(values) == 1:
            fixed.append(arg)
        elif key in FIXED_KEYS:
            raise BadInputError(f"{key} cannot vary in a sweep: every trial must charge the same population and units")
        else:
            axes.append((key, values))
    return fixed, axes


def trial_overrides(axes: list[tuple[str, list[str]]]) -> list[list[str]]:
    """The grid: one override list per trial (the cartesian product, the first axis slowest)."""
    keys = [k for k, _ in axes]
    combos = itertools.product(*(values for _, values in axes))
    return [[f"{k}={v}" for k, v in zip(keys, combo, strict=True)] for combo in combos]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepResult:
    """The sweep's outcome: the released folder, its ``tuning`` record entry and the summary (``sweep.json``)."""

    release_dir: Path
    tuning: dict
    summary: dict


def _contracts(config: Path, fixed: list[str], grid: list[list[str]], out_dir: Path) -> list:
    """Every trial's validated contract (output folder ``DIR/trial-NN``); all must be DP on one population."""
    from dplora.contract.loader import load_contract, replace_overrides

    if len(grid) > MAX_TRIALS:
        raise BadInputError(f"the grid has {len(grid)} trials; a sweep runs at most {MAX_TRIALS}")
    contracts = [
        load_contract(
            config, replace_overrides([*fixed, *trial], [f"training.output_dir={out_dir / f'trial-{i:02d}'}"])
        )
        for i, trial in enumerate(grid, start=1)
    ]
    first = contracts[0].privacy
    if not first.enabled:
        raise BadInputError("privacy.enabled=false: a sweep composes the trials' ε; run a control with dplora train")
    if not first.population:
        raise BadInputError(
            "a sweep charges every trial to the budget ledger: set privacy.population (and its cap with "
            "`dplora ledger set-cap`)"
        )
    return contracts


def _selection_table(contract, options: SweepOptions):
    """(table or None, source in words, public) of the selection set; None: the trials' own held-out evaluation."""
    from dplora.data import public as public_data
    from dplora.evaluate.heldout import held_out_table

    match options.select_by:
        case SelectBy.DEMO:
            table, source = public_data.public_table(
                contract.data, contract.privacy, None, num_tickets=options.eval_tickets, option="", units=False
            )
            return table, source, True
        case SelectBy.PUBLIC:
            table, source = public_data.public_table(
                contract.data, contract.privacy, options.eval_file, num_tickets=0, option="--eval-public", units=False
            )
            return table, source, True
        case SelectBy.PRIVATE:
            name = Path(options.eval_file).name
            key, seed = contract.privacy.unit_key, contract.training.seed
            table = held_out_table(contract.data, options.eval_file, unit_key=key, seed=seed)
            return table, f"--eval-private {name} (private)", False
        case SelectBy.CONTRACT:
            if not contract.data.has_eval_set:
                raise BadInputError("--eval-contract: the contract has no data.eval_path or data.eval_fraction")
            public = contract.data.eval_public
            return None, "the contract's own held-out set" + (" (declared public)" if public else " (private)"), public
    raise ValueError(options.select_by)  # pragma: no cover


def _check_budget(contracts, options: SweepOptions) -> list:
    """Plan every trial (as train plans: ``auto`` B and T resolved by the planner first,
    :func:`dplora.plan.resolve.resolve_auto`) and check that the ledger cap holds all of them together.

    Returns:
        One :class:`dplora.plan.training.TrainingPlan` per trial, in grid order.

    Raises:
        BadInputError: ``auto`` without a declared ``privacy.num_units``, or bad data (exit 2).
        PlanRefusedError: a trial's plan, or the trials together over the cap (exit 2).
    """
    from dplora.data.units import count_units
    from dplora.ledger.plans import check_plans
    from dplora.ledger.store import Ledger, default_ledger_path
    from dplora.plan.resolve import plan_for, resolve_auto

    resolved = [resolve_auto(c)[0] for c in contracts]  # as run_training resolves each trial's contract
    plans = [plan_for(c, count_units(c.data, c.privacy, seed=c.training.seed)) for c in resolved]
    with Ledger(options.ledger_path or default_ledger_path(), create=False) as ledger:
        try:
            check_plans(ledger, contracts[0].privacy, plans)
        except PlanRefusedError as err:
            raise PlanRefusedError(f"the sweep's {len(plans)} trials together: {err}") from None
    return plans


def _evaluate(result, table, source: str, public: bool, options: SweepOptions, log):
    """The trial's held-out loss on the selection set (its own evaluation with ``--eval-contract``)."""
    if table is None:
        return result.evaluation
    from dplora.data import public as public_data
    from dplora.evaluate.heldout import evaluate_model
    from dplora.release.read import load_adapter_model, read_run

    run = read_run(result.output_dir)
    model, tokenizer, device = load_adapter_model(run, threads=options.threads, log=log)
    data = public_data.eval_data(run.contract.data, table)
    return evaluate_model(
        model,
        tokenizer,
        table,
        data,
        run.contract.training,
        device=device,
        source=source,
        public=public,
        private_run=True,
    )


def run_sweep(config: Path, args: list[str], options: SweepOptions, *, log=print, private_log=None) -> SweepResult:
    """Run the grid, charge every trial, pick by held-out loss and sign one release stating the composed ε.

    Args:
        config: the contract file.
        args: ``KEY=VALUE`` (every trial) and ``KEY=V1,V2,...`` (an axis of the grid) arguments.
        options: :class:`SweepOptions`.
        log: the public log (stderr; a CI job publishes it).
        private_log: where each trial's loss on a PRIVATE selection set goes (an interactive operator's terminal),
            or None to keep it in ``<out_dir>.private/sweep.json`` only: such a loss is a statistic of the private
            data that no accountant charges. Losses on a public set go to ``log``.

    Returns:
        :class:`SweepResult`.

    Raises:
        BadInputError, PlanRefusedError: before any trial runs (nothing written, nothing charged).
        TrainingFailedError: a trial failed (its charge stays; no release; finished trials are deleted).
    """
    from dplora.recipe.config import protected_inputs
    from dplora.recipe.train import run_training
    from dplora.release import envelope as release
    from dplora.release import keys as release_keys
    from dplora.release.keys import generate_keypair

    fixed, axes = parse_grid(args)
    grid = trial_overrides(axes)
    out_dir = Path(options.out_dir)
    contracts = _contracts(config, fixed, grid, out_dir)
    private_key = release_keys.load_private_key(options.signing_key)
    release.load_data_key(options.data_key)
    protected = protected_inputs(
        contracts[0],
        contract_path=config,
        signing_key=options.signing_key,
        data_key=options.data_key,
        ledger_path=options.ledger_path,
    )
    outputs.check_output_dir(out_dir, overwrite=False, protected=protected)
    table, source, public = _selection_table(contracts[0], options)
    _check_budget(contracts, options)
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = Path(tempfile.mkdtemp(prefix="dplora-sweep-"))
    results, done = [], []
    try:
        # a throw-away key: trials are not releases; the chosen one is re-signed with the user's key
        trial_key, trial_pub = generate_keypair(keys / "trial.key", overwrite=True)
        for i, (contract, trial) in enumerate(zip(contracts, grid, strict=True), start=1):
            log(f"sweep: trial {i}/{len(grid)}: {' '.join(trial) or '(no overrides)'}")
            result = run_training(
                contract,
                RunOptions(
                    signing_key=trial_key,
                    data_key=options.data_key,
                    ledger_path=options.ledger_path,
                    threads=options.threads,
                    progress=options.progress,
                    tuning_trial=True,
                    contract_path=config,
                    ledger_release=False,
                ),
                log=log,
            )
            done.append(result.output_dir)
            evaluation = _evaluate(result, table, source, public, options, log)
            results.append((trial, result, evaluation))
            if public:
                log(f"sweep: trial {i}: ε={result.epsilon_spent:.4f}, held-out loss {evaluation.adapter.loss:.4f}")
            else:
                log(f"sweep: trial {i}: ε={result.epsilon_spent:.4f}")
                if private_log is not None:
                    private_log(
                        f"sweep: trial {i}: held-out loss {evaluation.adapter.loss:.4f} "
                        "(NOT COVERED BY DP: private evaluation set)"
                    )
        chosen = min(range(len(results)), key=lambda k: results[k][2].adapter.loss)
        tuning = tuning_entry(results, chosen, source=source, public=public, adjacency=contracts[0].privacy.adjacency)
        release_dir = _release(results[chosen][1], tuning, private_key, options, trial_pub)
    except BaseException:
        for folder in done:  # finished trials are not releases; their charges stay in the ledger
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(outputs.private_path(folder), ignore_errors=True)
        raise
    finally:
        shutil.rmtree(keys, ignore_errors=True)
    for k, folder in enumerate(done):
        if k != chosen:
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(outputs.private_path(folder), ignore_errors=True)
    summary, private = _summary(results, chosen, tuning, release_dir)
    if private is not None:  # losses on private data: the sweep's private folder, never beside the release
        folder = outputs.private_path(out_dir)
        folder.mkdir(exist_ok=True)
        atomic.write_json(folder / SUMMARY_FILENAME, private, sort_keys=False)
    atomic.write_json(out_dir / SUMMARY_FILENAME, summary, sort_keys=False)
    from dplora.release.read import read_statement

    started = (read_statement(release_dir / release.RELEASE_FILENAME) or {}).get("predicate", {}).get("started_at")
    if started:  # the summary carries the chosen release's start, not the time the sweep ended
        outputs.fix_mtimes(out_dir / SUMMARY_FILENAME, started)
        outputs.stamp_folders([out_dir], started)
    return SweepResult(release_dir=release_dir, tuning=tuning, summary=summary)


def tuning_entry(results, chosen: int, *, source: str, public: bool, adjacency) -> dict:
    """The record's ``tuning`` entry: every trial's (ε, δ) and mechanism, the composed total, the attack ceiling of
    all trials composed (:func:`dplora.release.audit_section.tuning_attack_ceiling`) and the selection.

    Held-out losses enter only when the selection set is public; a private selection is marked not covered.

    Raises:
        ValueError: a trial's mechanism numbers are malformed (from the ceiling).
    """
    per_trial = []
    for trial, result, evaluation in results:
        p = result.plan
        entry = {
            "overrides": list(trial),
            "run_id": result.run_id,
            "epsilon": result.epsilon_spent,
            "delta": p.delta,
            "accountant": p.accountant.value,
            "sample_rate": p.sample_rate,
            "noise_multiplier": p.noise_multiplier,
            "steps": result.steps_done,
            # the trial's resolved B and rate (public plan numbers): an override such as training.lr=auto or
            # expected_batch_size=auto says what was asked, these what ran
            "expected_batch_size": p.expected_batch_size,
            "lr": p.lr,
        }
        if public:
            entry["held_out_loss"] = evaluation.adapter.loss
        per_trial.append(entry)
    adjacency = getattr(adjacency, "value", adjacency)
    total = compose(per_trial, adjacency)
    # every trial's outputs shape the signed record (the choice and this entry): its ceiling is all trials composed
    ceiling = tuning_attack_ceiling(per_trial, adjacency, covered=public)
    selection = {"metric": METRIC, "eval_set": "public" if public else "private", "source": source}
    selection |= {"covered": public, "chosen_trial": chosen + 1, "chosen_run_id": results[chosen][1].run_id}
    if public:
        selection["evaluation"] = results[chosen][2].to_dict() | {"label": f"public selection set: {source}"}
    return {
        "trials": len(results),
        "trial_run_ids": [r.run_id for _, r, _ in results],
        "per_trial": per_trial,
        **total,
        "attack_ceiling": ceiling,
        "covered": public,
        "statement": COVERED if public else NOT_COVERED,
        "selection": selection,
        "ledger": "each trial is charged its own (ε, δ) as a tuning trial; the ledger sums them (basic composition)",
    }


def _release(result, tuning: dict, private_key, options: SweepOptions, trial_pub: Path) -> Path:
    """Re-sign the chosen trial: its record (checked under the throw-away key) plus ``tuning``, by the user's key."""
    from dplora.contract.loader import load_contract
    from dplora.ledger.store import Ledger, default_ledger_path
    from dplora.release import report
    from dplora.release.verify import verify_release

    folder = result.output_dir
    record = dict(verify_release(folder, trial_pub).statement["predicate"])
    accounting = {
        **record["accounting"],
        "composition": "this trial alone; `tuning` states the total over all trials of the sweep",
    }
    ceiling = None
    if isinstance(record.get("attack_ceiling"), dict):  # the trial's own: the release's claim is tuning's
        ceiling = {
            **record["attack_ceiling"],
            "scope": "this trial alone; the release's ceiling is tuning.attack_ceiling (all trials composed)",
            "holds_for": "this trial alone; the release's ceiling is tuning.attack_ceiling (all trials composed)",
        }
    contract = load_contract(folder / "contract.yaml")
    path = report.resign(
        folder,
        record,
        private_key=private_key,
        data=contract.data,
        tuning=tuning,
        accounting=accounting,
        attack_ceiling=ceiling,
    )
    with Ledger(options.ledger_path or default_ledger_path(), create=False) as ledger:
        ledger.record_release(
            run_id=result.run_id,
            record_sha256=digests.sha256_file(path),
            epsilon=result.epsilon_spent,
            delta=result.plan.delta,
            label=f"sweep: chosen trial {tuning['selection']['chosen_trial']} of {tuning['trials']}",
        )
    return folder


def _summary(results, chosen: int, tuning: dict, release_dir: Path) -> tuple[dict, dict | None]:
    """(``sweep.json``: the tuning entry and the release folder; the private summary, or None on a public set).

    Losses on a public selection set are public (in the tuning entry); on a private set they go to the private
    summary only (``<out_dir>.private/sweep.json``), labelled NOT covered by DP.
    """
    summary = {"release": str(release_dir), "tuning": tuning}
    if tuning["covered"]:
        return summary, None  # the public losses are in the signed tuning entry (per_trial)
    private = {
        "not_covered_by_dp": {
            "held_out_loss": [e.adapter.loss for _, _, e in results],
            "note": "losses on a private evaluation set: computed on private data, NOT covered by DP; never publish",
        }
    }
    return summary, private


def tuning_claim(predicate: dict) -> str | None:
    """One line for ``dplora verify``: the sweep's total ε and whether the choice is covered (None: no sweep)."""
    tuning = predicate.get("tuning") if isinstance(predicate, dict) else None
    if not isinstance(tuning, dict):
        return None
    cover = "choice on a public set, covered" if tuning.get("covered") else "NOT COVERED: chosen on private data"
    return (
        f"tuning: {tuning.get('trials')} trials, total ε={tuning.get('total_epsilon'):.4f}, "
        f"δ={tuning.get('total_delta'):g} ({tuning.get('composition')}); {cover}"
    )
