"""``dplora synth`` and the synthetic part of ``dplora verify --synthetic``: parse and call, nothing more.

The command calls :func:`dplora.synth.files.synthesize`; ``verify`` calls :func:`check_synthetic`, which calls
:func:`dplora.synth.verify.verify_synthetic` and shapes its result as verify's checks, claims and one line.
"""

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from dplora.cli.common import emit_json, fail, log, out
from dplora.cli.options import (
    JsonLineOpt,
    ReleaseDataKeyOpt,
    ReleaseDataOpt,
    ReleaseModelOpt,
    RunArg,
    SeedOpt,
    SigningKeyOpt,
    ThreadsOpt,
    TopPOpt,
    allow_non_private_option,
    max_new_tokens_option,
    prompts_option,
    show_private_option,
    temperature_option,
)
from dplora.errors import DploraError
from dplora.surface import PrivateLog, echo_private, private_notice


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticPart:
    """What ``verify --synthetic`` adds: check entries (as verify's), a JSON ``synthetic`` object and one line."""

    checks: list[dict]
    claims: dict
    line: str


def check_synthetic(synthetic: Path, manifest: Path | None, release_path: Path, release, public) -> SyntheticPart:
    """Verify ``synthetic`` against its manifest and the already verified ``release``; verify's output parts.

    Raises:
        BadInputError: unreadable file or manifest (exit 2).
        VerificationError: a signature, digest or chain mismatch (exit 3).
    """
    from dplora.synth.files import NO_DP_GUARANTEE
    from dplora.synth.verify import verify_synthetic

    result = verify_synthetic(synthetic, release_path, public, manifest=manifest, release=release)
    predicate = result.statement.get("predicate") or {}
    source = (predicate.get("source_release") or {}).get("record_digest", {}).get("sha256", "")
    checks = [
        ("manifest", f"{result.manifest.name} is signed by this key (DSSE, in-toto Statement v1)"),
        ("synthetic file", f"{Path(synthetic).name} matches the manifest's sha256 ({predicate.get('rows')} rows)"),
        ("chain", f"the manifest names this release's record (sha256 {source[:12]}…)"),
    ]
    private = result.differentially_private
    claims = {
        "file": str(synthetic),
        "manifest": str(result.manifest),
        "predicate_type": result.statement.get("predicateType"),
        "differentially_private": private,
        "rows": predicate.get("rows"),
        "columns": predicate.get("columns"),
        "guarantee": predicate.get("guarantee"),
        "generation": predicate.get("generation"),
    }
    line = f"synthetic: {predicate.get('guarantee')}"
    if not private and NO_DP_GUARANTEE not in line:  # a control's guarantee starts with it; say it in any case
        line = f"synthetic: {NO_DP_GUARANTEE}; {predicate.get('guarantee')}"
    return SyntheticPart(checks=[{"check": c, "ok": True, "detail": d} for c, d in checks], claims=claims, line=line)


RowsOpt = Annotated[int, typer.Option(min=1, metavar="N", help="Records to generate.")]
OutFileOpt = Annotated[Path, typer.Option("--out", metavar="FILE", help="The synthetic file (.csv or .jsonl).")]
PromptsOpt = Annotated[
    Path | None, prompts_option("Public prompts: a csv column (training's name or 'prompt'), or lines.")
]
TemperatureOpt = Annotated[float, temperature_option("0 is greedy; > 0 samples.")]
MaxNewTokensOpt = Annotated[int, max_new_tokens_option("row")]
SynthFormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        metavar="auto|columns|messages",
        help="messages: jsonl conversations (user = prompt, assistant = reply); columns: the run's columns; "
        "auto: messages for a conversations run, else columns.",
    ),
]
SynthShowPrivateOpt = Annotated[
    bool,
    show_private_option(
        "Print the verbatim-match counts (private, NOT covered by DP) under CI, without a terminal or in --json."
    ),
]
AllowNonPrivateOpt = Annotated[bool, allow_non_private_option("Synthesize from a control run, marked NO DP GUARANTEE.")]


def synth(
    run: RunArg,
    rows: RowsOpt,
    out_file: OutFileOpt,
    prompts: PromptsOpt = None,
    temperature: TemperatureOpt = 1.0,
    top_p: TopPOpt = 1.0,
    max_new_tokens: MaxNewTokensOpt = 64,
    seed: SeedOpt = None,
    signing_key: SigningKeyOpt = None,
    allow_non_private: AllowNonPrivateOpt = False,
    as_json: JsonLineOpt = False,
    threads: ThreadsOpt = None,
    record_format: SynthFormatOpt = "auto",
    show_private: SynthShowPrivateOpt = False,
    data: ReleaseDataOpt = None,
    model: ReleaseModelOpt = None,
    data_key: ReleaseDataKeyOpt = None,
) -> None:
    """Synthetic records in the training schema from base + released adapters (post-processing: no budget).

    Writes FILE and its signed manifest FILE.dsse.json; the verbatim-match counts (computed on the private data,
    not covered by DP) go to <run>.private/synth/FILE.memorisation.json and are printed only on a terminal or
    with --show-private. A relative path in the run's contract is read from here, else from the run folder's
    parent; --data and --model stand in for a moved release's files.
    """
    shown = echo_private(as_json=as_json, show_private=show_private)
    from dplora.evaluate.generate import Sampling
    from dplora.release.keys import load_private_key
    from dplora.release.locate import ReleaseInputs
    from dplora.synth.files import synthesize

    try:
        key = load_private_key(signing_key)
        sampling = Sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
        result = synthesize(
            run,
            rows=rows,
            out=out_file,
            prompts_file=prompts,
            sampling=sampling,
            private_key=key,
            allow_non_private=allow_non_private,
            threads=threads,
            record_format=record_format,
            log=log,
            private_log=PrivateLog(log if shown else None),
            inputs=ReleaseInputs(data=data, model=model, data_key=data_key),
        )
    except DploraError as err:
        raise fail(err, as_json=as_json) from None
    _report(result, as_json=as_json, shown=shown)
    if not shown:  # on every such run, whether or not a verbatim match was withheld
        log(private_notice(str(result.report), "verbatim-match counts, data notes"))


def _report(result, *, as_json: bool, shown: bool) -> None:
    """The written file, its manifest and the verbatim check (or the ``--json`` document)."""
    from dplora.synth.files import NO_DP_GUARANTEE

    memo = result.memorisation
    if as_json:
        emit_json(
            {
                "ok": True,
                "file": str(result.out),
                "manifest": str(result.manifest),
                "report": str(result.report),
                "rows": result.rows,
                "differentially_private": result.differentially_private,
                "guarantee": result.guarantee,
                **({"verbatim": memo} if shown else {}),  # counts of the private data: --show-private only
            }
        )
        return
    if memo.get("checked"):
        check = (
            f"{memo['exact_row_matches']} rows equal a training row verbatim, "
            f"{memo['exact_generated_field_matches']} generated fields equal a training row's"
        )
    else:
        check = memo["note"]
    mark = f"{NO_DP_GUARANTEE}: " if not result.differentially_private else ""
    out.print(f"{mark}wrote {result.rows} rows to {result.out}; manifest {result.manifest}", markup=False)
    if shown:
        out.print(f"verbatim check (not covered by DP): {check}; counts in {result.report}", markup=False)
    else:
        out.print(f"verbatim check: counts in {result.report} (private, not covered by DP)", markup=False)


def register(app: typer.Typer) -> None:
    """Add ``synth`` to ``app``, in this order."""
    app.command(short_help="Synthetic records from the run's release, with a signed manifest.")(synth)
