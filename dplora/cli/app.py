"""The ``dplora`` command line: parses arguments and calls the library, nothing more.

Exit codes (README "Exit codes"): 0 success; 2 bad input or a refused plan; 3 ``verify`` found a mismatch;
4 training failed; 5 ``audit`` (and ``verify`` of a record whose attached audit says so): the empirical ε lower
bound exceeds the claimed ε; 6 a non-private (``privacy.enabled: false``) run used without
``--allow-non-private``; 130 interrupted; 1 an unexpected internal error. ``--json`` (train, budget, verify, eval,
synth, validate) prints exactly one JSON document on stdout, also on a handled error (``{"ok": false, "exit_code": N,
"error": "..."}``); progress and messages go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from dplora import __version__
from dplora.errors import BadInputError, DploraError, one_line


class OneLineErrorGroup(typer.core.TyperGroup):
    """Usage errors (unknown command or option, bad option value) as one ``error:`` line on stderr, exit 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Run the CLI as ``dplora`` (whatever the launcher); ``standalone_mode`` exits with the command's code."""
        try:
            code = super().main(args, "dplora", complete_var, standalone_mode=False, **extra)
        except typer.TyperException as err:  # typer's click exceptions: UsageError, BadParameter, NoSuchOption, ...
            if not standalone_mode:
                raise
            if err.__class__.__name__ == "NoArgsIsHelpError":  # bare `dplora`: the help text, as click prints it
                err.show()
                code = 2
            else:
                ctx = getattr(err, "ctx", None)
                where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
                message = one_line(f"{' '.join(err.format_message().split())}{where}")
                typer.echo(f"error: {message}", err=True)
                if "--json" in (sys.argv[1:] if args is None else args):
                    _emit_json(_error_doc(2, message))
                code = 2
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            code = 1
        code = code if isinstance(code, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    cls=OneLineErrorGroup,
    help="Differentially private LoRA fine-tuning from a declared privacy contract, with a signed release record.",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain click help: wraps at any width, never cuts words
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)
console = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)  # one line per message
out = Console(highlight=False, markup=False, soft_wrap=True)  # stdout: never hard-wrapped

ConfigArg = Annotated[Path, typer.Argument(metavar="CONFIG", help="The YAML privacy contract.", show_default=False)]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="KEY=VALUE",
        help="Overrides with dotted keys, e.g. training.lr=1e-3 privacy.target_epsilon=8.",
        show_default=False,
    ),
]
LedgerOpt = Annotated[
    Path | None,
    typer.Option(
        "--ledger", metavar="PATH", help="Budget ledger (SQLite). Default: $DPLORA_LEDGER or the user data dir."
    ),
]


def _print_version(value: bool) -> None:
    if value:
        out.print(f"dplora {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Differentially private LoRA fine-tuning from a declared privacy contract, with a signed release record."""


def _fail(err: DploraError, *, as_json: bool = False) -> typer.Exit:
    """Print the error as one bounded line on stderr (and, with ``--json``, as a JSON document on stdout)."""
    message = one_line(str(err))
    console.print(f"error: {message}", markup=False, soft_wrap=True)
    if as_json:
        _emit_json(_error_doc(err.exit_code, message))
    return typer.Exit(code=err.exit_code)


def _error_doc(code: int, message: str) -> dict:
    return {"ok": False, "exit_code": code, "error": message}


def _finite(obj):
    """JSON-safe copy: non-finite floats become null (JSON has no NaN or Infinity)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _emit_json(doc: dict) -> None:
    """Exactly one JSON document on stdout (ASCII, so any locale can read it)."""
    typer.echo(json.dumps(_finite(doc), indent=2, ensure_ascii=True, allow_nan=False))


def _log(message: str) -> None:
    console.print(one_line(message, limit=2000), markup=False, soft_wrap=True)


@app.command(short_help="Dry run: N, q, T, σ and ε, without loading a model.")
def budget(
    config: ConfigArg,
    overrides: OverridesArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    plot: Annotated[
        Path | None, typer.Option(metavar="PNG", help="Write ε against steps to this PNG (matplotlib).")
    ] = None,
    sweep: Annotated[bool, typer.Option(help="Also show σ for a few batch sizes and epochs (RDP).")] = False,
    ledger: LedgerOpt = None,
    world_size: Annotated[
        int, typer.Option(min=1, metavar="W", help="Processes of a multi-process run: units per rank per step.")
    ] = 1,
) -> None:
    """Dry run: plan N, q, T and σ and report ε, without loading a model.

    N comes from privacy.num_units if declared, else from counting protected units in the data.
    """
    from dplora.tuning import budget as budget_mod

    t0 = time.perf_counter()
    if plot is not None and plot.suffix.lower() != ".png":
        raise _fail(BadInputError(f"--plot {plot}: the plot is a PNG file; use a name ending in .png"), as_json=as_json)
    try:
        report = budget_mod.budget_report(
            config, overrides or [], ledger_path=ledger, sweep=sweep, world_size=world_size
        )
        if plot is not None:
            budget_mod.plot_curve(report, plot)
    except DploraError as err:
        raise _fail(err, as_json=as_json) from None
    report["seconds"] = round(time.perf_counter() - t0, 3)
    if as_json:
        _emit_json({"ok": True, **report})
    else:
        budget_mod.print_report(report, out)


@app.command(short_help="Fine-tune LoRA adapters under the contract; sign the release.")
def train(
    config: ConfigArg,
    overrides: OverridesArg = None,
    signing_key: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH", help="Ed25519 private key (PEM) that signs the release. Default: $DPLORA_SIGNING_KEY."
        ),
    ] = None,
    data_key: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH", help="Data owner's key for the keyed data digest (HMAC-SHA256). Default: $DPLORA_DATA_KEY."
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            help="Replace a previous dplora run's output folder (never another folder) once the run succeeds."
        ),
    ] = False,
    ledger: LedgerOpt = None,
    threads: Annotated[
        int | None,
        typer.Option(min=1, max=1024, metavar="N", help="CPU threads. Default: the cores free right now."),
    ] = None,
    progress: Annotated[
        bool, typer.Option(help="Report progress on stderr: a bar on a terminal, a plain line every 30 s otherwise.")
    ] = True,
    tuning_trial: Annotated[
        bool, typer.Option(help="Charge the ledger as a hyperparameter-tuning trial: it spends budget like a release.")
    ] = False,
    resume: Annotated[
        bool, typer.Option(help="Continue from the resume checkpoint in <output_dir>.partial (same contract and data).")
    ] = False,
    non_private: Annotated[
        bool,
        typer.Option(
            "--non-private",
            help="Allow a privacy.enabled=false control on a ledger population; the ledger records it as ε=∞.",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON summary on stdout (progress and messages stay on stderr).")
    ] = False,
) -> None:
    """Fine-tune LoRA adapters with DP-SGD under the contract and write a signed release."""
    import contextlib
    import signal

    from dplora.contract.spec import load_contract
    from dplora.recipe.train import run_training

    def _terminate(signum, _frame):  # SIGTERM (CI cancel) is handled like Ctrl-C: FAILED.json, ledger settled
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _terminate)
    started = time.time()
    output_dir = None
    try:
        # stdout is kept for the final line or JSON document: anything a library prints during the run goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            contract = load_contract(config, overrides or [])
            output_dir = contract.training.output_dir
            result = run_training(
                contract,
                signing_key=signing_key,
                data_key=data_key,
                overwrite=overwrite,
                ledger_path=ledger,
                threads=threads,
                progress=progress,
                tuning_trial=tuning_trial,
                non_private=non_private,
                contract_path=config,
                resume=resume,
                log=_log,
            )
    except DploraError as err:
        raise _fail(err, as_json=as_json) from None
    except KeyboardInterrupt as err:
        message = _interrupted_message(err, output_dir, since=started)
        _log(message)
        if as_json:
            _emit_json(_error_doc(130, one_line(message.removeprefix("error: "))))
        raise typer.Exit(code=130) from None
    if result.release_path is None:  # a rank other than 0 of a multi-process run: rank 0 reports for the run
        return
    p = result.plan
    if not result.differentially_private:
        from dplora.engine.control import NO_DP_STATEMENT

        _log(
            f"done: {result.steps_done}/{p.steps} steps ({result.empty_steps} empty), {result.seconds_per_step:.2f} "
            f"s/step, {result.threads} threads; {NO_DP_STATEMENT}"
        )
        if as_json:
            _emit_json(_train_summary(result))
        else:
            out.print(f"non-private record (no DP guarantee): {result.release_path}", markup=False)
        return
    _log(
        f"done: {result.steps_done}/{p.steps} steps ({result.empty_steps} empty), ε={result.epsilon_spent:.4f} "
        f"≤ {p.target_epsilon:g} at δ={p.delta:g} ({p.accountant.value}), {result.seconds_per_step:.2f} s/step, "
        f"{result.threads} threads"
    )
    if as_json:
        _emit_json(_train_summary(result))
    else:
        out.print(f"release: {result.release_path}", markup=False)
    from dplora.run.outputs import private_path

    _log(f"private (not covered by DP; keep local, never ship): {private_path(result.output_dir)}")


def _train_summary(result) -> dict:
    """``train --json``: the run id, the plan's public numbers, ε spent, the paths written and the seconds."""
    from dplora.release.envelope import SIGSTORE_FILENAME
    from dplora.run import outputs

    p, folder = result.plan, result.output_dir.absolute()
    bundle = folder / SIGSTORE_FILENAME
    private = outputs.private_path(folder)
    return {
        "ok": True,
        "run_id": result.run_id,
        "differentially_private": result.differentially_private,
        "protected_unit": p.protected_unit.value,
        "unit_key": p.unit_key,
        "adjacency": p.adjacency.value,
        "num_units": p.num_units,
        "num_units_source": p.num_units_source,
        "expected_batch_size": p.expected_batch_size,
        "sample_rate": p.sample_rate,
        "steps": p.steps,
        "steps_done": result.steps_done,
        "empty_steps": result.empty_steps,
        "noise_multiplier": p.noise_multiplier,
        "max_grad_norm": p.max_grad_norm,
        "epsilon_spent": result.epsilon_spent,
        "target_epsilon": p.target_epsilon,
        "delta": p.delta,
        "accountant": p.accountant.value,
        "accountant_version": p.accountant_version,
        "paths": {
            "output_dir": str(folder),
            "adapter": str(folder / "adapter"),
            "release": str(folder / result.release_path.name),
            "sigstore_bundle": str(bundle) if bundle.is_file() else None,
            "private_dir": str(private),
            "metrics": str(private / outputs.METRICS_FILENAME),
        },
        "threads": result.threads,
        "seconds": round(result.seconds, 3),
        "seconds_per_step": round(result.seconds_per_step, 3),
    }


def _interrupted_message(err: KeyboardInterrupt, output_dir: str | None, *, since: float) -> str:
    """One line for Ctrl-C / SIGTERM: the signal, and this run's FAILED.json if the run got that far."""
    from dplora.run import outputs

    what = str(err.args[0]) if err.args else "Ctrl-C"
    if what.startswith("interrupted ("):  # the run's own line: the signal, FAILED.json, how to resume
        return f"error: {what}"
    message = f"error: interrupted ({what}); no release was written"
    if output_dir is not None:
        failed = outputs.staging_path(outputs.output_path(output_dir)) / outputs.FAILED_FILENAME
        if failed.is_file() and failed.stat().st_mtime >= since - 1:
            return f"{message}; see {failed}"
    return f"{message}; training had not started, nothing was written"


@app.command(short_help="Create an Ed25519 signing key pair.")
def keygen(
    path: Annotated[
        Path, typer.Argument(metavar="PATH", help="Where to write the Ed25519 private key (mode 0600).")
    ] = Path("dplora-signing.key"),
    public: Annotated[
        Path | None, typer.Option(metavar="PATH", help="Public key path. Default: PATH with suffix .pub.")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace existing key files.")] = False,
) -> None:
    """Create an Ed25519 signing key pair for release records."""
    from dplora.release.envelope import generate_keypair

    try:
        priv, pub = generate_keypair(path, public, overwrite=overwrite)
    except DploraError as err:
        raise _fail(err) from None
    out.print(f"private key: {priv} (mode 0600)\npublic key:  {pub}", markup=False)


@app.command(short_help="Check a release: signature, artifacts, data digest.")
def verify(
    release_path: Annotated[Path, typer.Argument(metavar="RELEASE", help="release.dsse.json or its folder.")],
    public_key: Annotated[Path, typer.Option(metavar="PATH", help="The signer's Ed25519 public key (PEM).")],
    data: Annotated[
        list[Path] | None, typer.Option(metavar="FILE", help="Data file(s) to check against the keyed digest.")
    ] = None,
    data_key: Annotated[
        Path | None, typer.Option(metavar="PATH", help="The data owner's HMAC key (with --data).")
    ] = None,
    base_model: Annotated[
        Path | None,
        typer.Option(metavar="PATH", help="Base model folder or .gguf file to check against the recorded digests."),
    ] = None,
    allow_non_private: Annotated[
        bool, typer.Option("--allow-non-private", help="Exit 0 for an intact non-private (control) record.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document instead of lines.")] = False,
    synthetic: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="Also check a synthetic file (dplora synth), its manifest and chain."),
    ] = None,
    manifest: Annotated[
        Path | None, typer.Option(metavar="PATH", help="The synthetic file's manifest. Default: FILE.dsse.json.")
    ] = None,
) -> None:
    """Check a release: signature, artifact digests, and optionally the keyed data digest and the base model.

    A non-private control run's record prints NOT DIFFERENTIALLY PRIVATE and exits 6 unless --allow-non-private.
    --synthetic FILE also checks a dplora synth file: its signed manifest, its sha256 and that it names this release.
    """
    from dplora.cli.synth import check_synthetic
    from dplora.release.envelope import load_data_key, load_public_key
    from dplora.release.verify import verify_release

    if data_key is not None and not data:
        no_data = BadInputError("--data-key needs --data FILE: the data file(s) whose keyed digest to check")
        raise _fail(no_data, as_json=as_json)
    try:
        key = load_data_key(data_key) if data else None
        public = load_public_key(public_key)
        result = verify_release(release_path, public_key, data_files=data or None, data_key=key, base_model=base_model)
        synth = check_synthetic(synthetic, manifest, release_path, result, public) if synthetic else None  # issue 18
    except DploraError as err:
        raise _fail(err, as_json=as_json) from None
    from dplora.audit.attach import summary_line

    checks = _verify_checks(result, public_key, public, data or [], base_model) + (synth.checks if synth else [])
    from dplora.release.verify import shipping_note

    shipping = shipping_note(release_path if release_path.is_dir() else release_path.parent)
    code = 0 if result.differentially_private or allow_non_private else 6
    code = 5 if code == 0 and result.audit and result.audit.get("violation") else code  # the attached audit failed
    if as_json:
        doc = {"ok": code == 0, "release": str(release_path), "differentially_private": result.differentially_private}
        if code:
            doc |= {"exit_code": code, "error": summary_line(result.audit) if code == 5 else _claim_line(result)}
        doc |= {"synthetic": synth.claims} if synth else {}
        doc |= {"shipping": shipping}
        _emit_json(doc | {"checks": checks, "claims": _claims(result.statement), "audit": result.audit})
        raise typer.Exit(code=code)
    for c in checks:
        out.print(f"{'OK' if c['ok'] else '--'}  {c['check']}: {c['detail']}", markup=False, soft_wrap=True)
    out.print(shipping, markup=False, soft_wrap=True)
    out.print(_claim_line(result), markup=False, soft_wrap=True)
    if result.audit is not None:
        out.print(summary_line(result.audit), markup=False, soft_wrap=True)
    if tuning := _tuning_line(result.statement):
        out.print(tuning, markup=False, soft_wrap=True)
    if synth:
        out.print(synth.line, markup=False, soft_wrap=True)
    if code:
        raise typer.Exit(code=code)


def _verify_checks(result, key_path: Path, public, data: list[Path], base_model: Path | None) -> list[dict]:
    """One entry per check that ran (``ok`` false: not checked), as ``verify`` prints them."""
    import hashlib

    from cryptography.hazmat.primitives import serialization as ser

    statement = result.statement
    raw = public.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    fingerprint = hashlib.sha256(raw).hexdigest()[:16]
    names = [s["name"] for s in statement["subject"]]
    rule = {"securesystemslib": "securesystemslib", "raw-key": "raw-key (an older release)", "none": "empty"}
    bundle = "; release.sigstore.json holds the same envelope" if result.bundle else "; no release.sigstore.json"
    checks = [
        ("key", True, f"{key_path} is an Ed25519 public key (sha256 of its raw bytes {fingerprint}…)"),
        (
            "signature",
            True,
            "the DSSE envelope (in-toto Statement v1) is signed by this key; "
            f"key id rule {rule[result.key_id_rule.value]}{bundle}",
        ),
        ("artifacts", True, f"{len(names)} files match their signed sha256 digests; no unsigned files"),
    ]
    if data:
        files = ", ".join(p.name for p in data)
        checks.append(("data digest", True, f"keyed HMAC-SHA256 of {files} matches the record"))
    else:
        checks.append(("data digest", False, "not checked (pass --data FILE --data-key KEY)"))
    if base_model is not None:
        checks.append(("base model", True, f"sha256 of {', '.join(result.base_model_files)} matches the record"))
    if result.audit is not None:
        checks.append(("audit", True, "the attached audit section is signed with the record and names its mechanism"))
    return [{"check": name, "ok": ok, "detail": detail} for name, ok, detail in checks]


def _claim_line(result) -> str:
    """What the release claims, in one line (a non-private control says so)."""
    statement = result.statement
    if not result.differentially_private:
        from dplora.engine.control import NOT_DP

        return (
            f"{NOT_DP}: the record is a non-private control run (privacy.enabled=false): no clipping, no noise, "
            "no DP guarantee (ε = ∞)"
        )
    acc = statement["predicate"]["accounting"]
    unit = statement["predicate"]["privacy"]
    return (
        f"release: {unit['protected_unit']}-level ({unit['adjacency']}) ε={acc['epsilon_spent']:.4f}, "
        f"δ={acc['delta']:g}, {acc['accountant']} ({acc['accountant_version']})"
    )


def _tuning_line(statement: dict) -> str | None:
    """A sweep's release: its trials' total ε and whether the choice is covered (``dplora sweep``); else None."""
    from dplora.tuning.sweep import tuning_claim

    return tuning_claim(statement.get("predicate"))


def _claims(statement: dict) -> dict:
    """What a verified release claims (``verify --json``): the unit, the accounting, the run id and the files."""
    predicate = statement["predicate"]
    acc, unit = predicate.get("accounting") or {}, predicate.get("privacy") or {}
    keys = ("epsilon_spent", "target_epsilon", "delta", "accountant", "accountant_version", "steps_done")
    return {
        "run_id": predicate.get("run_id"),
        "protected_unit": unit.get("protected_unit"),
        "adjacency": unit.get("adjacency"),
        **{k: acc.get(k) for k in keys},
        "artifacts": [s["name"] for s in statement["subject"]],
        **({"tuning": predicate["tuning"]} if "tuning" in predicate else {}),
    }


RunArg = Annotated[
    Path, typer.Argument(metavar="RUN_OR_CONFIG", help="A finished run folder, or the contract that wrote it.")
]
ThreadsOpt = Annotated[
    int | None, typer.Option(min=1, metavar="N", help="CPU threads. Default: the cores free right now.")
]


@app.command("eval", short_help="Held-out loss of the base model and of the adapters.")
def eval_(
    run: RunArg,
    eval_path: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="Evaluate on this file (same columns) instead of the run's held-out set."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of lines.")] = False,
    threads: ThreadsOpt = None,
    group_column: Annotated[
        str | None,
        typer.Option(
            metavar="COL",
            help="Also report per group of this column (public labels only; groups under 10 records are not named). "
            "Default: data.group_column.",
        ),
    ] = None,
) -> None:
    """Held-out loss and perplexity of the base model and of the run's adapters (same masking as training).

    The held-out set is the run's data.eval_path or data.eval_fraction split (from its contract.yaml), or
    --eval-path. Numbers on private held-out data are NOT covered by DP; this command never changes a release.
    """
    from dplora.evaluate.heldout import evaluate_run, report_lines

    try:
        evaluation = evaluate_run(run, eval_path=eval_path, threads=threads, log=_log, group_column=group_column)
    except DploraError as err:
        raise _fail(err, as_json=as_json) from None
    if as_json:
        _emit_json({"ok": True, **evaluation.to_dict(), "differentially_private": evaluation.differentially_private})
        return
    for line in report_lines(evaluation):
        out.print(line, markup=False, soft_wrap=True)


@app.command(short_help="Replies from the base model + the run's adapters.")
def generate(
    run: RunArg,
    prompt: Annotated[str | None, typer.Option(metavar="TEXT", help="One prompt.")] = None,
    prompts: Annotated[Path | None, typer.Option(metavar="FILE", help="A UTF-8 file with one prompt per line.")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, metavar="N", help="Tokens generated at most per reply.")] = 64,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 is greedy (deterministic); > 0 samples.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus mass kept when sampling, in (0, 1].")] = 1.0,
    seed: Annotated[int | None, typer.Option(metavar="N", help="Seed for sampling. Default: OS entropy.")] = None,
    allow_non_private: Annotated[
        bool, typer.Option("--allow-non-private", help="Generate from a non-private control run (no DP guarantee).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON line per prompt.")] = False,
    threads: ThreadsOpt = None,
) -> None:
    """Replies from the base model + the run's adapters (post-processing of the release: no budget spent)."""
    from dplora.evaluate.generate import Sampling, generate_from_run, read_prompts

    try:
        texts = read_prompts(prompt, prompts)
        sampling = Sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
        replies = generate_from_run(
            run, texts, sampling=sampling, allow_non_private=allow_non_private, threads=threads, log=_log
        )
    except DploraError as err:
        raise _fail(err, as_json=as_json) from None  # --json: the error as one JSON line, like the replies
    for text, reply in zip(texts, replies, strict=True):
        if as_json:
            out.print(json.dumps({"prompt": text, "reply": reply}, ensure_ascii=False), markup=False, soft_wrap=True)
        else:
            out.print(reply if len(texts) == 1 else f"> {text}\n{reply}\n", markup=False, soft_wrap=True)


@app.command(short_help="Check a contract without reading data or a model.")
def validate(
    config: ConfigArg,
    overrides: OverridesArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document instead of a line.")] = False,
) -> None:
    """Check a contract (keys, values, allowed choices) without reading data or loading a model."""
    from dplora.contract.spec import load_contract

    try:
        contract = load_contract(config, overrides or [])
    except DploraError as err:
        raise _fail(err, as_json=as_json) from None
    if as_json:
        _emit_json({"ok": True, "contract": str(config), "sha256": contract.sha256})
        return
    out.print(f"OK: contract {config} is valid (sha256 {contract.sha256[:16]}…)", markup=False)


@app.command("demo-data", short_help="Generate fake support tickets (csv or jsonl).")
def demo_data(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="Output file (.csv or .jsonl).")] = Path(
        "demo/tickets.csv"
    ),
    tickets: Annotated[int, typer.Option(min=1, metavar="N", help="Number of tickets.")] = 1000,
    seed: Annotated[int, typer.Option(metavar="N", help="Generator seed.")] = 0,
    max_turns: Annotated[int, typer.Option(min=1, metavar="N", help="Exchanges per ticket, 1..N (one row each).")] = 1,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing file.")] = False,
) -> None:
    """Generate fake support tickets (ticket_id, customer_id, message, reply; 1–5 tickets per customer)."""
    from dplora.data.demo import write_tickets

    try:
        summary = write_tickets(path, num_tickets=tickets, seed=seed, overwrite=overwrite, max_turns=max_turns)
    except DploraError as err:
        raise _fail(err) from None
    out.print(
        f"wrote {summary['num_rows']} rows: {summary['num_tickets']} tickets from "
        f"{summary['num_customers']} customers to {path}"
    )


@app.command("prepare-twcs", short_help="Customer tweet → first brand reply pairs (TWCS).")
def prepare_twcs(
    src: Annotated[Path, typer.Argument(metavar="SRC", help="twcs csv (Customer Support on Twitter).")],
    dest: Annotated[Path, typer.Argument(metavar="DEST", help="Output pairs file (.csv or .jsonl).")],
    overwrite: Annotated[bool, typer.Option(help="Replace an existing file.")] = False,
) -> None:
    """Pair each customer tweet with its first brand reply, keyed by the customer's author_id."""
    from dplora.data.twcs import write_twcs_pairs

    try:
        summary = write_twcs_pairs(src, dest, overwrite=overwrite)
    except DploraError as err:
        raise _fail(err) from None
    out.print(f"wrote {summary['num_pairs']} pairs from {summary['num_customers']} customers to {dest}")


def _mount_ledger() -> None:
    try:
        from dplora.cli.ledger import ledger_app
    except ImportError:  # pragma: no cover
        return
    app.add_typer(ledger_app, name="ledger", help="Privacy budget ledger across releases (SQLite).")


_mount_ledger()


def _mount_audit() -> None:
    from dplora.cli.audit import register

    register(app, config_arg=ConfigArg, overrides_arg=OverridesArg, fail=_fail, log=_log, out=out)


_mount_audit()


def _mount_tuning() -> None:
    from dplora.cli.tuning import register

    register(app, config_arg=ConfigArg, overrides_arg=OverridesArg, fail=_fail, log=_log, out=out)


_mount_tuning()


def _mount_synth() -> None:
    from dplora.cli.synth import register

    register(app, run_arg=RunArg, threads_opt=ThreadsOpt, fail=_fail, log=_log, out=out, emit_json=_emit_json)


_mount_synth()


def main() -> None:
    """Console entry point: one-line errors, never a traceback (set DPLORA_DEBUG=1 to see one)."""
    try:
        app()
    except KeyboardInterrupt:
        console.print("error: interrupted; no release was written")
        sys.exit(130)
    except Exception as err:  # noqa: BLE001 - last resort: never print private text or a traceback
        if os.environ.get("DPLORA_DEBUG"):
            raise
        message = f"unexpected {err.__class__.__name__}; rerun with DPLORA_DEBUG=1 for details"
        console.print(f"error: {message}")
        if "--json" in sys.argv[1:]:
            _emit_json(_error_doc(1, message))
        sys.exit(1)
