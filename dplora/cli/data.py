"""``dplora validate``, ``init``, ``demo-data`` and ``prepare-twcs``: contracts and data files before training."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from dplora import atomic
from dplora.cli.common import emit_json, fail, log, out
from dplora.cli.options import ConfigArg, JsonLineOpt, OverridesArg, ReplaceFileOpt, show_private_option
from dplora.data.demo import write_tickets
from dplora.data.twcs import write_twcs_conversations, write_twcs_pairs
from dplora.data.twcs_tweets import DEFAULT_BRANDS, load_brands
from dplora.errors import BadInputError, DploraError
from dplora.surface import echo_private, private_notice

CheckFilesOpt = Annotated[
    bool,
    typer.Option(
        "--check-files",
        help="Also check the model (config.json, weights, tokenizer, chat template) and the data file (its columns "
        "and conversation shape) from their headers and schema, without torch.",
    ),
]


def validate(
    config: ConfigArg,
    overrides: OverridesArg = None,
    check_files: CheckFilesOpt = False,
    as_json: JsonLineOpt = False,
) -> None:
    """Check a contract (keys, values, allowed choices) without reading data or loading a model; with
    --check-files also the model folder and the data file's header or schema (never its values)."""
    from dplora.contract.loader import load_contract

    lines: list[str] = []
    try:
        contract = load_contract(config, overrides or [])
        if check_files:  # the model's files, then the data's (its columns; the model's chat template if known)
            from dplora.data.precheck import check_data_files
            from dplora.engine.precheck import check_model_files

            model_line, template = check_model_files(contract.model)
            unit_key = contract.privacy.unit_key
            lines = [model_line, *check_data_files(contract.data, unit_key, chat_template=template)]
    except DploraError as err:
        raise fail(err, as_json=as_json) from None
    if as_json:
        doc = {"ok": True, "contract": str(config), "sha256": contract.sha256}
        emit_json({**doc, "files": lines} if check_files else doc)
        return
    checked = "" if check_files else "; files not checked (--check-files)"
    out.print(f"OK: contract {config} is valid (sha256 {contract.sha256[:16]}…){checked}", markup=False)
    for line in lines:
        out.print(line, markup=False, soft_wrap=True)


InitDataArg = Annotated[
    Path,
    typer.Argument(metavar="DATA", help="The data file (csv, jsonl, json or parquet): only its structure is read."),
]
InitModelArg = Annotated[
    str, typer.Argument(metavar="MODEL", help="smollm2-135m, a local model folder or .gguf file, or a Hub id ORG/NAME.")
]
InitOutOpt = Annotated[Path, typer.Option("--out", metavar="FILE", help="Where to write the contract.")]


def init(
    data: InitDataArg,
    model: InitModelArg,
    out_path: InitOutOpt = Path("contract.yaml"),
    overwrite: ReplaceFileOpt = False,
) -> None:
    """Write a commented contract for DATA and MODEL: format, columns and chat shape from the file's structure only
    (column names and types, never values or counts). N, ε and δ are left as DECLARE with the reasons in comments:
    the contract fails validation until you declare them."""
    from dplora.contract.init import contract_text

    try:
        if out_path.exists() and not overwrite:
            raise BadInputError(f"{out_path} exists; pass --overwrite to replace it")
        if out_path.is_dir():
            raise BadInputError(f"--out {out_path} is a folder; give a file name such as contract.yaml")
        text, shape = contract_text(data, model)
        atomic.write_text(out_path, text)
    except DploraError as err:
        raise fail(err) from None
    except OSError as err:
        raise fail(BadInputError(f"cannot write {out_path}: {err.strerror or err.__class__.__name__}")) from None
    out.print(
        f"wrote {out_path}: {shape.name}; declare privacy.num_units, privacy.target_epsilon and privacy.delta "
        f"(marked DECLARE), then: dplora validate {out_path}",
        markup=False,
        soft_wrap=True,
    )


DemoPathArg = Annotated[Path, typer.Argument(metavar="PATH", help="Output file (.csv or .jsonl).")]
TicketsOpt = Annotated[int, typer.Option(min=1, metavar="N", help="Number of tickets.")]
DemoSeedOpt = Annotated[int, typer.Option(metavar="N", help="Generator seed.")]
MaxTurnsOpt = Annotated[
    int | None,
    typer.Option(min=1, metavar="N", help="Exchanges per ticket, 1..N (one row each). Default 1; 2 with messages."),
]
DemoFormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        metavar="rows|messages",
        help="rows: one message/reply row per exchange; messages: one jsonl conversation per ticket "
        "(ticket_id, customer_id, messages), some multi-turn.",
    ),
]


def demo_data(
    path: DemoPathArg = Path("demo/tickets.csv"),
    tickets: TicketsOpt = 1000,
    seed: DemoSeedOpt = 0,
    max_turns: MaxTurnsOpt = None,
    overwrite: ReplaceFileOpt = False,
    record_format: DemoFormatOpt = "rows",
) -> None:
    """Generate fake support tickets (ticket_id, customer_id, message, reply; 1–5 tickets per customer).

    --format messages: one conversation per ticket instead (ticket_id, customer_id, messages; .jsonl).
    """
    try:
        summary = write_tickets(
            path, num_tickets=tickets, seed=seed, overwrite=overwrite, max_turns=max_turns, record_format=record_format
        )
    except DploraError as err:
        raise fail(err) from None
    kind = "conversations" if record_format == "messages" else "rows"
    out.print(
        f"wrote {summary['num_rows']} {kind}: {summary['num_tickets']} tickets from "
        f"{summary['num_customers']} customers to {path}"
    )


SrcArg = Annotated[Path, typer.Argument(metavar="SRC", help="twcs csv (Customer Support on Twitter).")]
DestArg = Annotated[Path, typer.Argument(metavar="DEST", help="Output pairs file (.csv or .jsonl).")]
ConversationsOpt = Annotated[
    bool,
    typer.Option(
        "--conversations",
        help="One multi-turn conversation per reply thread (jsonl, column messages), keyed by the customer who "
        "opened it. Privacy rule: tweets by any other customer are dropped with every reply below them, and "
        "every @mention of anyone but the thread's customer and the brands becomes @customer (pairs are redacted "
        "alike). A brand reply that quotes another person without an @ cannot be caught; an inbound value other "
        "than True/False, one the brand rule contradicts, or a repeated tweet_id is refused.",
    ),
]
BrandsOpt = Annotated[
    Path | None,
    typer.Option(
        "--brands",
        metavar="FILE",
        help="Public list of brand handles, one a line (# comments). Default: TWCS's numbering rule (an id "
        "starting with a digit is a customer's, any other a brand's). Never read from the data: a customer's "
        "records depend on no other customer's tweets.",
    ),
]


TwcsShowPrivateOpt = Annotated[
    bool,
    show_private_option(
        "Print the counts of the private file (customers, pairs or conversations, turns, redactions: NOT "
        "covered by DP) under CI or without a terminal; the operator then owns that log",
    ),
]


def prepare_twcs(
    src: SrcArg,
    dest: DestArg,
    conversations: ConversationsOpt = False,
    brands: BrandsOpt = None,
    overwrite: ReplaceFileOpt = False,
    show_private: TwcsShowPrivateOpt = False,
) -> None:
    """Pair each customer tweet with its first brand reply, keyed by the customer's author_id.

    The counts (customers, pairs, turns, redactions) are counts of the private data: printed only on an
    interactive terminal or with --show-private, never in a CI log.

    --conversations: one conversation per thread instead (customer tweet → user turn, brand reply → assistant
    turn, in time order); see docs/data_formats.md for the rule that keeps other customers' text out. Brands come
    from --brands FILE or TWCS's numbering rule, never from the data.
    """
    try:
        rule = DEFAULT_BRANDS if brands is None else load_brands(brands)
        if conversations:
            summary = write_twcs_conversations(src, dest, overwrite=overwrite, brands=rule)
        else:
            summary = write_twcs_pairs(src, dest, overwrite=overwrite, brands=rule)
    except DploraError as err:
        raise fail(err) from None

    kind = "conversations" if conversations else "pairs"
    if not echo_private(show_private=show_private, stream=sys.stdout):
        out.print(f"wrote {kind} to {dest} (its counts are private: --show-private prints them)", markup=False)
        log(private_notice("not printed here", "counts of the written file"))
        return
    if conversations:
        turns, rule = summary["turns_per_conversation"], summary["rule"]
        out.print(
            f"wrote {summary['num_conversations']} conversations from {summary['num_customers']} customers to {dest} "
            f"(turns p50 {turns['p50']}, p90 {turns['p90']}, max {turns['max']}); privacy rule: "
            f"{rule.get('turns_dropped_by_rule', 0)} tweets dropped, {rule.get('threads_dropped_by_rule', 0)} threads "
            f"dropped, {rule.get('mentions_redacted', 0)} tweets with another person's id redacted "
            "(private counts, not covered by DP)",
            markup=False,
        )
        return
    out.print(
        f"wrote {summary['num_pairs']} pairs from {summary['num_customers']} customers to {dest}; privacy rule: "
        f"{summary['rule'].get('mentions_redacted', 0)} texts with another person's id redacted "
        "(private counts, not covered by DP)",
        markup=False,
    )
