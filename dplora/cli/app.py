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
from pathlib import Path
from typing import Annotated

import typer

from dplora import __version__, atomic
from dplora.cli import data as data_cmd
from dplora.cli import train as train_cmd
from dplora.cli import verify as verify_cmd
from dplora.cli.common import (
    console,
    emit_json,
    error_doc,
    fail,
    linger_before_quiet_exit,
    log,
    out,
    quiet_worker,
)
from dplora.cli.options import (
    JsonLinesOpt,
    ReleaseDataKeyOpt,
    ReleaseDataOpt,
    ReleaseModelOpt,
    RunArg,
    SeedOpt,
    ThreadsOpt,
    TopPOpt,
    allow_non_private_option,
    expand_user_paths,
    json_option,
    max_new_tokens_option,
    overwrite_option,
    prompts_option,
    public_key_option,
    show_private_option,
    temperature_option,
)
from dplora.errors import BadInputError, DploraError, one_line
from dplora.evaluate.plot import plot_run
from dplora.evaluate.report import report_lines
from dplora.run.outputs import private_folder, staging_path
from dplora.surface import echo_private, private_notice


def _nearest_option(err) -> str | None:
    """``No such option: --overwite; did you mean --overwrite?`` for click's ``NoSuchOption``: the one nearest of the
    command's options (``difflib``, cutoff 0.5), instead of click's list of possibilities; None for other errors or
    when no option is near."""
    import difflib

    if err.__class__.__name__ != "NoSuchOption":  # typer vendors click (typer._click): match by name
        return None
    ctx = getattr(err, "ctx", None)
    names = [o for p in (ctx.command.params if ctx is not None else []) for o in (*p.opts, *p.secondary_opts)]
    names = [n for n in names if n.startswith("-")] or list(err.possibilities or [])
    name = err.option_name.split("=", 1)[0]
    meant = _meant_option(name, ctx)
    if meant is not None:
        return f"No such option: {name}; {meant}"
    near = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    if not near:
        return None
    return f"No such option: {name}; did you mean {near[0]}?"


# What other tools' users type for the positional contract or run folder (axolotl, TRL, the HF Trainer's scripts).
_CONFIG_OPTIONS = ("config", "contract", "c", "cfg", "config_file", "config_path", "yaml")
_RUN_OPTIONS = ("run", "run_dir", "output_dir", "model_dir", "adapter", "checkpoint")


def _meant_option(name: str, ctx) -> str | None:
    """What an unknown option most likely means, by meaning rather than spelling, or None: ``--config`` on a command
    that takes the contract as its first argument (``dplora train CONTRACT.yaml``), ``--run`` on one that takes a
    run folder, and a contract key (``--lr``, ``--learning-rate``: another tool's name) on a command that takes
    overrides (``training.lr=…``), or a training setting on one that does not (set when training). Spelling alone
    would send ``--lr`` to ``--ledger`` (train) or ``--model`` (eval)."""
    if ctx is None:
        return None
    key = name.lstrip("-").replace("-", "_").lower()
    params = {p.name: p for p in ctx.command.params if p.param_type_name == "argument"}
    command = ctx.command_path
    if key in _CONFIG_OPTIONS and "config" in params:
        return f"the contract is the first argument: {command} CONTRACT.yaml"
    if key in (*_RUN_OPTIONS, *_CONFIG_OPTIONS) and "run" in params:
        return f"the run folder (or its contract) is the first argument: {command} RUN"
    from dplora.contract.aliases import ALIASES
    from dplora.contract.spec import Contract

    keys = [f"{s}.{k}" for s, f in Contract.model_fields.items() for k in f.annotation.model_fields if k == key]
    if not keys and key in ALIASES:
        keys = [ALIASES[key][0]]
    if not keys:
        return None
    if "overrides" not in params:  # a training setting on eval, generate, ...: spelling would pick an unrelated option
        if all(k.split(".", 1)[0] in ("privacy", "lora", "training") for k in keys):
            return f"{keys[0]} is a contract key, set when training: dplora train CONTRACT.yaml {keys[0]}=…"
        return None
    if len(keys) == 1:
        return f"use the override {keys[0]}=…: {command} CONTRACT.yaml {keys[0]}=…"
    return "use the override " + " or ".join(f"{k}=…" for k in keys) + f" after the contract: {command} CONTRACT.yaml"


class OneLineErrorGroup(typer.core.TyperGroup):
    """Usage errors (unknown command or option, bad option value) as one ``error:`` line on stderr, exit 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Run the CLI as ``dplora`` (whatever the launcher); ``standalone_mode`` exits with the command's code."""
        expand_user_paths(self)  # `~` in every path argument and option
        try:
            code = super().main(args, "dplora", complete_var, standalone_mode=False, **extra)
        except typer.TyperException as err:  # typer's click exceptions: UsageError, BadParameter, NoSuchOption, ...
            if not standalone_mode:
                raise
            if err.__class__.__name__ == "NoArgsIsHelpError":  # bare `dplora`: the help text, as click prints it
                err.show()
                code = 2
            elif quiet_worker():  # a launcher's other processes: the first one on the node prints the line
                linger_before_quiet_exit()
                code = 2
            else:
                ctx = getattr(err, "ctx", None)
                where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
                text = _nearest_option(err) or " ".join(err.format_message().split())
                message = one_line(f"{text}{where}")
                typer.echo(f"error: {message}", err=True)
                if "--json" in (sys.argv[1:] if args is None else args):
                    emit_json(error_doc(2, message))
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


app.command(short_help="Dry run: N, q, T, σ and ε, without loading a model.")(train_cmd.budget)
app.command(short_help="Fine-tune LoRA adapters under the contract; sign the release.")(train_cmd.train)


KeyPathArg = Annotated[Path, typer.Argument(metavar="PATH", help="Where to write the Ed25519 private key (mode 0600).")]
KeyPublicOpt = Annotated[
    Path | None, typer.Option(metavar="PATH", help="Public key path. Default: PATH with suffix .pub.")
]
KeyOverwriteOpt = Annotated[bool, overwrite_option("existing key files")]


@app.command(short_help="Create an Ed25519 signing key pair.")
def keygen(
    path: KeyPathArg = Path("dplora-signing.key"),
    public: KeyPublicOpt = None,
    overwrite: KeyOverwriteOpt = False,
) -> None:
    """Create an Ed25519 signing key pair for release records."""
    from dplora.release.keys import generate_keypair

    try:
        priv, pub = generate_keypair(path, public, overwrite=overwrite)
    except DploraError as err:
        raise fail(err) from None
    out.print(f"private key: {priv} (mode 0600)\npublic key:  {pub}", markup=False)


app.command(short_help="Check a release: signature, artifacts, data digest.")(verify_cmd.verify)


EvalPathOpt = Annotated[
    Path | None,
    typer.Option(metavar="FILE", help="Evaluate on this file (same columns) instead of the run's held-out set."),
]
GroupColumnOpt = Annotated[
    str | None,
    typer.Option(
        metavar="COL",
        help="Also report per group of this column: only the contract's data.group_column (a declared public "
        "label) is accepted; groups under 10 records are not named. Default: data.group_column.",
    ),
]


EvalShowPrivateOpt = Annotated[
    bool,
    show_private_option(
        "Print numbers on a private held-out set (NOT covered by DP) under CI, without a terminal or with "
        "--json too. They are always written to <run>.private/eval.json.",
    ),
]


@app.command("eval", short_help="Held-out loss of the base model and of the adapters.")
def eval_(
    run: RunArg,
    eval_path: EvalPathOpt = None,
    as_json: JsonLinesOpt = False,
    threads: ThreadsOpt = None,
    group_column: GroupColumnOpt = None,
    show_private: EvalShowPrivateOpt = False,
    data: ReleaseDataOpt = None,
    model: ReleaseModelOpt = None,
    data_key: ReleaseDataKeyOpt = None,
) -> None:
    """Held-out loss and perplexity of the base model and of the run's adapters (same masking as training).

    A data.task: classification run also gets accuracy and per-label recall over its declared labels, under
    data.calibration (per token, uncalibrated by default) with the other scoring beside; a data.label_column run
    gets exact-match accuracy. The held-out set is the run's data.eval_path or data.eval_fraction split (from its
    contract.yaml), or --eval-path. Numbers on private held-out data are NOT covered by DP: they are written to
    <run>.private/eval.json and printed only on an interactive terminal (or with --show-private); this command
    never changes a release. --group-column may only name the contract's data.group_column (a declared public
    label). A relative path in the run's contract is read from here, else from the run folder's parent; --data and
    --model stand in for a moved release's files.
    """
    from dplora.evaluate.heldout import evaluate_run
    from dplora.release.locate import ReleaseInputs
    from dplora.release.read import read_run

    try:
        inputs = ReleaseInputs(data=data, model=model, data_key=data_key)
        evaluation = evaluate_run(
            run, eval_path=eval_path, threads=threads, log=log, group_column=group_column, inputs=inputs
        )
    except DploraError as err:
        raise fail(err, as_json=as_json) from None
    doc = {"ok": True, **evaluation.to_dict(), "differentially_private": evaluation.differentially_private}
    saved = private_folder(read_run(run).folder) / "eval.json"
    shown = echo_private(as_json=as_json, show_private=show_private, stream=sys.stdout)
    if not shown:  # on every such run, public held-out set or not: the line's presence never depends on the data
        log(private_notice(str(saved), "held-out numbers"))
    note = "numbers on private held-out data, NOT covered by DP"
    note = "held-out set declared public" if evaluation.public else note
    atomic.write_json(saved, {**doc, "note": note})  # the file the line names exists on every run
    if not evaluation.public and not shown:
        message = f"held-out numbers on private data (NOT covered by DP) written to {saved}; --show-private prints them"
        if as_json:
            emit_json({"ok": True, "public": False, "private_report": str(saved), "note": message})
        else:
            out.print(message, markup=False, soft_wrap=True)
        return
    if as_json:
        emit_json(doc)
        return
    for line in report_lines(evaluation):
        out.print(line, markup=False, soft_wrap=True)


@app.command(short_help="Plot loss, ε and step time of a run (a PRIVATE figure in <run>.private/).")
def plot(run: RunArg) -> None:
    """Plot the training loss, ε spent and step time against the logical step from <run>.private/metrics.jsonl into
    <run>.private/training.png. The figure is PRIVATE (loss and step times are computed on private data, NOT
    covered by DP): keep it local, never ship it."""
    from dplora.release.read import resolve_run_folder

    try:
        # a killed run has no output folder yet, only <run>.partial: plot_run finds its metrics there
        killed = not run.exists() and staging_path(run).is_dir()
        result = plot_run(run if killed else resolve_run_folder(run))
    except DploraError as err:
        raise fail(err) from None
    out.print(
        f"wrote {result.path} ({len(result.series.steps)} steps): PRIVATE, loss and step time are computed on "
        "private data and NOT covered by DP; keep it local, never ship it",
        markup=False,
        soft_wrap=True,
    )


PromptOpt = Annotated[str | None, typer.Option(metavar="TEXT", help="One prompt.")]
PromptsOpt = Annotated[Path | None, prompts_option("A UTF-8 file with one prompt per line.")]
MessagesOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
        help="One JSON conversation per line (a list of {role, content}, or an object with the run's messages "
        "column), rendered through the run's chat template with the generation prompt.",
    ),
]
MaxNewTokensOpt = Annotated[int, max_new_tokens_option("reply")]
TemperatureOpt = Annotated[float, temperature_option("0 is greedy (deterministic); > 0 samples.")]
GenerateAllowNonPrivateOpt = Annotated[
    bool, allow_non_private_option("Generate from a non-private control run (no DP guarantee).")
]
GeneratePublicKeyOpt = Annotated[
    Path | None, public_key_option("The signer's Ed25519 public key (PEM): the release is verified first.")
]
NoVerifyOpt = Annotated[
    bool, typer.Option("--no-verify", help="Generate without verifying the release (the output says unverified).")
]
GenerateJsonOpt = Annotated[bool, json_option("one JSON line per prompt.")]
ChoicesOpt = Annotated[
    str | None,
    typer.Option(
        metavar="LABELS",
        help="Rank these labels instead of generating: comma-separated, or @FILE (one label per line). Prints the "
        "chosen label, then every label's score (nats per token; minus the content-free input's where the run "
        "declares data.calibration: contextual); a tie goes to the first label given. --json: only those.",
    ),
]


@app.command(short_help="Replies from the base model + the run's adapters.")
def generate(
    run: RunArg,
    prompt: PromptOpt = None,
    prompts: PromptsOpt = None,
    messages: MessagesOpt = None,
    max_new_tokens: MaxNewTokensOpt = 64,
    temperature: TemperatureOpt = 0.0,
    top_p: TopPOpt = 1.0,
    seed: SeedOpt = None,
    allow_non_private: GenerateAllowNonPrivateOpt = False,
    public_key: GeneratePublicKeyOpt = None,
    no_verify: NoVerifyOpt = False,
    as_json: GenerateJsonOpt = False,
    threads: ThreadsOpt = None,
    choices: ChoicesOpt = None,
    model: ReleaseModelOpt = None,
) -> None:
    """Replies from the base model + the run's adapters (post-processing of the release: no budget spent).

    The release is verified with ``--public-key`` first (exit 3 on a mismatch); ``--no-verify`` skips that.
    ``--messages FILE`` replies to conversations, one reply per line (``--json``: one JSON line per conversation).
    ``--choices LABELS`` ranks the labels as the evaluation of a classification run does (length-normalised;
    calibrated on the run's content-free input where its contract declares data.calibration: contextual) and prints
    the chosen label. A relative model.path is read from here, else from the run folder's parent; ``--model`` stands
    in for a moved release's base model.
    """
    from dplora.evaluate.generate import Sampling, generate_from_run, read_conversations, read_prompts
    from dplora.release.locate import ReleaseInputs, locate_inputs
    from dplora.release.read import read_run

    if choices is not None:
        _choose(run, choices, prompt, prompts, messages, temperature, allow_non_private, public_key, no_verify,
                as_json, threads, model)  # fmt: skip
        return
    try:
        if messages is not None:
            if prompt is not None or prompts is not None:
                raise BadInputError("give --messages FILE or --prompt/--prompts, not both")
            texts = read_conversations(messages, read_run(run).contract.data.messages_column)
        else:
            texts = read_prompts(prompt, prompts)
        sampling = Sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
        # the base model found where the release now is (a given one checked); generation reads the located run
        located = locate_inputs(run, ReleaseInputs(model=model), data=False, log=log)
        replies = generate_from_run(
            located,
            texts,
            sampling=sampling,
            allow_non_private=allow_non_private,
            public_key=public_key,
            verify=not no_verify,
            threads=threads,
            log=log,
        )
    except DploraError as err:
        raise fail(err, as_json=as_json) from None  # --json: the error as one JSON line, like the replies
    if messages is not None:  # one reply per conversation, never the conversation's text
        for number, reply in enumerate(replies, start=1):
            line = json.dumps({"conversation": number, "reply": reply}, ensure_ascii=False) if as_json else reply
            out.print(line, markup=False, soft_wrap=True)
        return
    for text, reply in zip(texts, replies, strict=True):
        if as_json:
            out.print(json.dumps({"prompt": text, "reply": reply}, ensure_ascii=False), markup=False, soft_wrap=True)
        else:
            out.print(reply if len(texts) == 1 else f"> {text}\n{reply}\n", markup=False, soft_wrap=True)


def _choose(run, choices, prompt, prompts, messages, temperature, allow_non_private, public_key, no_verify, as_json,
            threads, model=None) -> None:  # fmt: skip
    """``generate --choices``: the chosen label and its scores per prompt (``--json``: only those)."""
    import math

    from dplora.contract.labels import parse_choices
    from dplora.evaluate.generate import choose_from_run, read_prompts
    from dplora.release.locate import ReleaseInputs, locate_inputs, private_data_paths
    from dplora.release.read import read_run

    try:
        if messages is not None:
            raise BadInputError("--choices ranks labels for --prompt/--prompts, not --messages")
        if temperature != 0:
            raise BadInputError("--choices ranks labels deterministically: --temperature does not apply")
        texts = read_prompts(prompt, prompts)
        # the data files, as written and beside the run folder, are compared by identity only, never read
        labels = parse_choices(choices, private=private_data_paths(read_run(run)))
        chosen = choose_from_run(
            locate_inputs(run, ReleaseInputs(model=model), data=False, log=log),
            texts,
            labels,
            allow_non_private=allow_non_private,
            public_key=public_key,
            verify=not no_verify,
            threads=threads,
            log=log,
        )
    except DploraError as err:
        raise fail(err, as_json=as_json) from None
    for text, choice in zip(texts, chosen, strict=True):
        scores = {k: v if math.isfinite(v) else None for k, v in choice.scores.items()}
        if as_json:  # the label and its scores only: never the prompt
            out.print(json.dumps({"label": choice.label, "scores": scores}, ensure_ascii=False), markup=False,
                      soft_wrap=True)  # fmt: skip
            continue
        lines = [choice.label] + [f"  {'-' if v is None else f'{v:+.4f}'}  {k}" for k, v in scores.items()]
        if len(texts) > 1:
            lines = [f"> {text}", *lines, ""]
        out.print("\n".join(lines), markup=False, soft_wrap=True)


app.command(short_help="Check a contract (--check-files: and its model and data files).")(data_cmd.validate)
app.command(short_help="Write a commented contract for a data file and a model.")(data_cmd.init)
app.command("demo-data", short_help="Generate fake support tickets (csv or jsonl).")(data_cmd.demo_data)
app.command("prepare-twcs", short_help="Customer tweet → first brand reply pairs, or conversations (TWCS).")(
    data_cmd.prepare_twcs
)


def _mount_ledger() -> None:
    try:
        from dplora.cli.ledger import ledger_app
    except ImportError:  # pragma: no cover
        return
    app.add_typer(ledger_app, name="ledger", help="Privacy budget ledger across releases (SQLite).")


_mount_ledger()


def _mount_audit() -> None:
    from dplora.cli.audit import register

    register(app)


_mount_audit()


def _mount_tuning() -> None:
    from dplora.cli.tuning import register

    register(app)


_mount_tuning()


def _mount_synth() -> None:
    from dplora.cli.synth import register

    register(app)


_mount_synth()


def _mount_export() -> None:
    from dplora.cli.export import register

    register(app)


_mount_export()


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
            emit_json(error_doc(1, message))
        sys.exit(1)
