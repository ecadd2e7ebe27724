"""``dplora synth`` and the synthetic part of ``dplora verify --synthetic``: parse and call, nothing more.

The command calls :func:`dplora.synth.files.synthesize`; ``verify`` calls :func:`check_synthetic`, which calls
:func:`dplora.synth.verify.verify_synthetic` and shapes its result as verify's checks, claims and one line.
"""

import dataclasses
from pathlib import Path
from typing import Annotated

import typer


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


def register(app: typer.Typer, *, run_arg, threads_opt, fail, log, out, emit_json) -> None:
    """Add the ``synth`` command to ``app`` (the CLI's argument types, error handling and JSON printer passed in)."""

    @app.command(short_help="Synthetic records from the run's release, with a signed manifest.")
    def synth(
        run: run_arg,
        rows: Annotated[int, typer.Option(min=1, metavar="N", help="Records to generate.")],
        out_file: Annotated[Path, typer.Option("--out", metavar="FILE", help="The synthetic file (.csv or .jsonl).")],
        prompts: Annotated[
            Path | None,
            typer.Option(metavar="FILE", help="Public prompts: a csv column (training's name or 'prompt'), or lines."),
        ] = None,
        temperature: Annotated[float, typer.Option(min=0.0, help="0 is greedy; > 0 samples.")] = 1.0,
        top_p: Annotated[float, typer.Option(help="Nucleus mass kept when sampling, in (0, 1].")] = 1.0,
        max_new_tokens: Annotated[int, typer.Option(min=1, metavar="N", help="Tokens generated at most per row.")] = 64,
        seed: Annotated[int | None, typer.Option(metavar="N", help="Seed for sampling. Default: OS entropy.")] = None,
        signing_key: Annotated[
            Path | None, typer.Option(metavar="PATH", help="Ed25519 private key (PEM). Default: $DPLORA_SIGNING_KEY.")
        ] = None,
        allow_non_private: Annotated[
            bool, typer.Option("--allow-non-private", help="Synthesize from a control run, marked NO DP GUARANTEE.")
        ] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document instead of a line.")] = False,
        threads: threads_opt = None,
    ) -> None:
        """Synthetic records in the training schema from base + released adapters (post-processing: no budget).

        Writes FILE, its signed manifest FILE.dsse.json and a local FILE.memorisation.json (verbatim-match counts,
        computed on the private data and not covered by DP).
        """
        from dplora.errors import DploraError
        from dplora.evaluate.generate import Sampling
        from dplora.release.keys import load_private_key
        from dplora.synth.files import NO_DP_GUARANTEE, synthesize

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
                log=log,
            )
        except DploraError as err:
            raise fail(err, as_json=as_json) from None
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
                    "verbatim": memo,
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
        out.print(f"verbatim check (not covered by DP): {check}; counts in {result.report}", markup=False)
