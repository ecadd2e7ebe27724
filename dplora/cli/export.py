"""``dplora export`` and the export part of ``dplora verify --export``: parse and call, nothing more.

The command calls :func:`dplora.export.files.export_release`; ``verify`` calls :func:`check_export`, which calls
:func:`dplora.export.verify.verify_export` and shapes its result as verify's checks, claims and one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dplora.cli.common import emit_json, fail, log, out
from dplora.cli.options import JsonLineOpt, RunArg, SigningKeyOpt, public_key_option
from dplora.cli.synth import SyntheticPart
from dplora.errors import BadInputError, DploraError
from dplora.export.files import export_release

ExportOutOpt = Annotated[Path, typer.Option("--out", metavar="DIR", help="A new folder, outside the run folder.")]
MergeOpt = Annotated[bool, typer.Option("--merge", help="Same as --format merge (the default).")]
FormatOpt = Annotated[
    str, typer.Option("--format", metavar="merge|peft", help="merge: merged safetensors model; peft: the adapter.")
]
PublicKeyOpt = Annotated[Path | None, public_key_option("The release signer's public key. Default: the signing key's.")]
BaseOpt = Annotated[
    Path | None, typer.Option(metavar="DIR", help="Base model folder to merge into. Default: the contract's model.")
]
LocalBaseOpt = Annotated[
    bool,
    typer.Option(
        "--local-base",
        help="With --format peft: name this machine's base folder in adapter_config.json, so that peft's "
        "AutoPeftModelForCausalLM loads the copy here (a local path: do not ship that folder).",
    ),
]
AllowControlOpt = Annotated[
    bool, typer.Option("--allow-control", help="Export a non-private control run, labelled NO DP GUARANTEE.")
]


def export(
    run: RunArg,
    out_dir: ExportOutOpt,
    merge: MergeOpt = False,
    fmt: FormatOpt = "merge",
    public_key: PublicKeyOpt = None,
    signing_key: SigningKeyOpt = None,
    base_model: BaseOpt = None,
    local_base: LocalBaseOpt = False,
    allow_control: AllowControlOpt = False,
    as_json: JsonLineOpt = False,
) -> None:
    """Export the release for serving: a merged model (safetensors) or the adapter folder, with a signed manifest.

    Verifies the release first and refuses a base other than the one the record names (post-processing: no budget).
    """
    from dplora.release.keys import load_private_key

    try:
        if merge and fmt != "merge":
            raise BadInputError(f"--merge with --format {fmt}: give one of them")
        key = load_private_key(signing_key)
        result = export_release(
            run,
            out=out_dir,
            fmt=fmt,
            private_key=key,
            public_key=public_key,
            base_model=base_model,
            local_base=local_base,
            allow_control=allow_control,
            log=log,
        )
    except DploraError as err:
        raise fail(err, as_json=as_json) from None
    if as_json:
        emit_json(
            {
                "ok": True,
                "out": str(result.out),
                "manifest": str(result.manifest),
                "format": result.format,
                "dtype": result.dtype,
                "files": list(result.files),
                "differentially_private": result.differentially_private,
                "guarantee": result.guarantee,
            }
        )
        return
    from dplora.synth.files import NO_DP_GUARANTEE

    mark = f"{NO_DP_GUARANTEE}: " if not result.differentially_private else ""
    what = f"merged model ({result.dtype})" if result.format == "merge" else "adapter folder"
    out.print(f"{mark}wrote {what}, {len(result.files)} files, to {result.out}; manifest {result.manifest.name}")
    out.print(f"export: {result.guarantee}", markup=False, soft_wrap=True)


def check_export(folder: Path, release_path: Path, release, public, base_model: Path | None) -> SyntheticPart:
    """Verify the export ``folder`` against the already verified ``release``; verify's checks, claims and line.

    Raises:
        BadInputError: unreadable folder or manifest (exit 2).
        VerificationError: a signature, digest, chain or merge mismatch (exit 3).
    """
    from dplora.export.verify import verify_export
    from dplora.synth.files import NO_DP_GUARANTEE

    result = verify_export(folder, release_path, public, base_model=base_model, release=release)
    predicate = result.statement.get("predicate") or {}
    source = (predicate.get("source_release") or {}).get("record_digest", {}).get("sha256", "")
    files = len(result.statement["subject"])
    checks = [
        ("export manifest", "dplora-export.dsse.json is signed by this key (DSSE, in-toto Statement v1)"),
        ("export files", f"{files} files match the manifest's sha256; no unsigned files"),
        ("export chain", f"the manifest names this release's record (sha256 {source[:12]}…)"),
    ]
    if result.merge_checked is not None:
        checks.append(("merge", f"base + released adapters merged again equal the export ({result.merge_checked})"))
    private = result.differentially_private
    claims = {
        "folder": str(folder),
        "predicate_type": result.statement.get("predicateType"),
        "format": predicate.get("format"),
        "differentially_private": private,
        "base_model": (predicate.get("base_model") or {}).get("name_or_path"),
        "merge": predicate.get("merge"),
        "merge_redone": result.merge_checked is not None,
        "guarantee": predicate.get("guarantee"),
    }
    line = f"export ({predicate.get('format')}): {predicate.get('guarantee')}"
    if not private and NO_DP_GUARANTEE not in line:
        line = f"export: {NO_DP_GUARANTEE}; {predicate.get('guarantee')}"
    return SyntheticPart(checks=[{"check": c, "ok": True, "detail": d} for c, d in checks], claims=claims, line=line)


def register(app: typer.Typer) -> None:
    """Add ``export`` to ``app``."""
    app.command(short_help="Export the release for serving (merged model or adapter), with a signed manifest.")(export)
