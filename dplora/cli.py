"""The ``dplora`` command line: parses arguments and calls the library, nothing more.

Exit codes: 0 success; 2 bad input or a refused plan; 3 ``verify`` found a mismatch; 4 training failed.
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

from dplora.errors import BadInputError, DploraError

app = typer.Typer(
    help="Differentially private LoRA fine-tuning from a declared privacy contract, with a signed release record.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)
console = Console(stderr=True, highlight=False)
out = Console(highlight=False)

ConfigArg = Annotated[Path, typer.Argument(help="The YAML privacy contract.", show_default=False)]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(help="Overrides KEY=VALUE with dotted keys, e.g. training.lr=1e-3 privacy.target_epsilon=8."),
]
LedgerOpt = Annotated[
    Path | None,
    typer.Option("--ledger", help="Budget ledger (SQLite). Default: $DPLORA_LEDGER or the user data dir."),
]


def _fail(err: DploraError) -> typer.Exit:
    console.print(f"error: {err}", markup=False, soft_wrap=True)
    return typer.Exit(code=err.exit_code)


def _log(message: str) -> None:
    console.print(message, markup=False, soft_wrap=True)


@app.command()
def budget(
    config: ConfigArg,
    overrides: OverridesArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Write ε against steps to this PNG (matplotlib).")] = None,
    sweep: Annotated[bool, typer.Option(help="Also show σ for a few batch sizes and epochs (RDP).")] = False,
    ledger: LedgerOpt = None,
) -> None:
    """Dry run: plan N, q, T and σ and report ε, without loading a model.

    N comes from privacy.num_units if declared, else from counting protected units in the data.
    """
    from dplora import budget as budget_mod

    t0 = time.perf_counter()
    if plot is not None and plot.suffix.lower() != ".png":
        raise _fail(BadInputError(f"--plot {plot}: the plot is a PNG file; use a name ending in .png"))
    try:
        report = budget_mod.budget_report(config, overrides or [], ledger_path=ledger, sweep=sweep)
        if plot is not None:
            budget_mod.plot_curve(report, plot)
    except DploraError as err:
        raise _fail(err) from None
    report["seconds"] = round(time.perf_counter() - t0, 3)
    if as_json:
        out.print_json(json.dumps(report))
    else:
        budget_mod.print_report(report, out)


@app.command()
def train(
    config: ConfigArg,
    overrides: OverridesArg = None,
    signing_key: Annotated[
        Path | None,
        typer.Option(help="Ed25519 private key (PEM) that signs the release. Default: $DPLORA_SIGNING_KEY."),
    ] = None,
    data_key: Annotated[
        Path | None,
        typer.Option(help="Data owner's key for the keyed data digest (HMAC-SHA256). Default: $DPLORA_DATA_KEY."),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace a non-empty output folder once the run succeeds.")] = False,
    ledger: LedgerOpt = None,
    threads: Annotated[int | None, typer.Option(min=1, help="CPU threads. Default: the cores that are free.")] = None,
    progress: Annotated[bool, typer.Option(help="Show the progress bar.")] = True,
    tuning_trial: Annotated[
        bool, typer.Option(help="Charge the ledger as a hyperparameter-tuning trial: it spends budget like a release.")
    ] = False,
) -> None:
    """Fine-tune LoRA adapters with DP-SGD under the contract and write a signed release."""
    import signal

    from dplora.contract import load_contract
    from dplora.train import run_training

    def _terminate(signum, _frame):  # SIGTERM (CI cancel) is handled like Ctrl-C: FAILED.json, ledger settled
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _terminate)
    try:
        contract = load_contract(config, overrides or [])
        result = run_training(
            contract,
            signing_key=signing_key,
            data_key=data_key,
            overwrite=overwrite,
            ledger_path=ledger,
            threads=threads,
            progress=progress and sys.stderr.isatty(),
            tuning_trial=tuning_trial,
            log=_log,
        )
    except DploraError as err:
        raise _fail(err) from None
    except KeyboardInterrupt:
        console.print("error: interrupted; no release was written (see <output_dir>.partial/FAILED.json)")
        raise typer.Exit(code=130) from None
    p = result.plan
    _log(
        f"done: {result.steps_done}/{p.steps} steps ({result.empty_steps} empty), ε={result.epsilon_spent:.4f} "
        f"≤ {p.target_epsilon:g} at δ={p.delta:g} ({p.accountant.value}), {result.seconds_per_step:.2f} s/step, "
        f"{result.threads} threads"
    )
    out.print(f"release: {result.release_path}", markup=False)


@app.command()
def keygen(
    path: Annotated[Path, typer.Argument(help="Where to write the Ed25519 private key (mode 0600).")] = Path(
        "dplora-signing.key"
    ),
    public: Annotated[Path | None, typer.Option(help="Public key path. Default: PATH with suffix .pub.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace existing key files.")] = False,
) -> None:
    """Create an Ed25519 signing key pair for release records."""
    from dplora.release import generate_keypair

    try:
        priv, pub = generate_keypair(path, public, overwrite=overwrite)
    except DploraError as err:
        raise _fail(err) from None
    out.print(f"private key: {priv} (mode 0600)\npublic key:  {pub}", markup=False)


@app.command()
def verify(
    release_path: Annotated[Path, typer.Argument(metavar="RELEASE", help="release.dsse.json or its folder.")],
    public_key: Annotated[Path, typer.Option(help="The signer's Ed25519 public key (PEM).")],
    data: Annotated[list[Path] | None, typer.Option(help="Data file(s) to check against the keyed digest.")] = None,
    data_key: Annotated[Path | None, typer.Option(help="The data owner's HMAC key (with --data).")] = None,
    base_model: Annotated[
        Path | None,
        typer.Option(help="Base model folder (or its .gguf file) to check against the recorded sha256 digests."),
    ] = None,
) -> None:
    """Check a release: signature, artifact digests, and optionally the keyed data digest and the base model."""
    from dplora.release import load_data_key
    from dplora.verify import verify_release

    if data_key is not None and not data:
        raise _fail(BadInputError("--data-key needs --data FILE: the data file(s) whose keyed digest to check"))
    try:
        key = load_data_key(data_key) if data else None
        result = verify_release(release_path, public_key, data_files=data or None, data_key=key, base_model=base_model)
    except DploraError as err:
        raise _fail(err) from None
    statement = result.statement
    acc = statement["predicate"]["accounting"]
    unit = statement["predicate"]["privacy"]
    out.print(
        f"OK: {len(statement['subject'])} artifacts; {unit['protected_unit']}-level ({unit['adjacency']}) "
        f"ε={acc['epsilon_spent']:.4f}, δ={acc['delta']:g}, {acc['accountant']} ({acc['accountant_version']})",
        markup=False,
    )
    rule = {"securesystemslib": "securesystemslib", "raw-key": "raw-key (an older release)", "none": "empty"}
    bundle = "same envelope in release.sigstore.json" if result.bundle else "no release.sigstore.json"
    out.print(f"signature: key id rule {rule[result.key_id_rule.value]}; {bundle}", markup=False, soft_wrap=True)
    if base_model is not None:
        matched = ", ".join(result.base_model_files)
        out.print(f"base model: sha256 of {matched} matches the record", markup=False, soft_wrap=True)


@app.command()
def validate(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Check a contract (keys, values, allowed choices) without reading data or loading a model."""
    from dplora.contract import load_contract

    try:
        contract = load_contract(config, overrides or [])
    except DploraError as err:
        raise _fail(err) from None
    out.print(f"OK: contract {config} is valid (sha256 {contract.sha256[:16]}…)", markup=False)


@app.command("demo-data")
def demo_data(
    path: Annotated[Path, typer.Argument(help="Output file (.csv or .jsonl).")] = Path("demo/tickets.csv"),
    tickets: Annotated[int, typer.Option(min=1, help="Number of tickets.")] = 1000,
    seed: Annotated[int, typer.Option(help="Generator seed.")] = 0,
    max_turns: Annotated[int, typer.Option(min=1, help="Exchanges per ticket, 1..N (one row each).")] = 1,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing file.")] = False,
) -> None:
    """Generate fake support tickets (ticket_id, customer_id, message, reply; 1–5 tickets per customer)."""
    from dplora.demo import write_tickets

    try:
        summary = write_tickets(path, num_tickets=tickets, seed=seed, overwrite=overwrite, max_turns=max_turns)
    except DploraError as err:
        raise _fail(err) from None
    out.print(
        f"wrote {summary['num_rows']} rows: {summary['num_tickets']} tickets from "
        f"{summary['num_customers']} customers to {path}"
    )


@app.command("prepare-twcs")
def prepare_twcs(
    src: Annotated[Path, typer.Argument(help="twcs csv (Customer Support on Twitter).")],
    dest: Annotated[Path, typer.Argument(help="Output pairs file (.csv or .jsonl).")],
    overwrite: Annotated[bool, typer.Option(help="Replace an existing file.")] = False,
) -> None:
    """Pair each customer tweet with its first brand reply, keyed by the customer's author_id."""
    from dplora.twcs import write_twcs_pairs

    try:
        summary = write_twcs_pairs(src, dest, overwrite=overwrite)
    except DploraError as err:
        raise _fail(err) from None
    out.print(f"wrote {summary['num_pairs']} pairs from {summary['num_customers']} customers to {dest}")


def _mount_ledger() -> None:
    try:
        from dplora.cli_ledger import ledger_app
    except ImportError:  # pragma: no cover
        return
    app.add_typer(ledger_app, name="ledger", help="Privacy budget ledger across releases (SQLite).")


_mount_ledger()


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
        console.print(f"error: unexpected {err.__class__.__name__}; rerun with DPLORA_DEBUG=1 for details")
        sys.exit(1)
