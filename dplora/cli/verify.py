"""``dplora verify``: check a release (and optionally a synthetic file chained to it), print what it claims."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dplora.cli.common import emit_json, fail, out
from dplora.cli.export import check_export
from dplora.cli.options import allow_non_private_option, data_key_option, json_option, public_key_option
from dplora.cli.synth import check_synthetic
from dplora.errors import BadInputError, DploraError

ReleasePathArg = Annotated[Path, typer.Argument(metavar="RELEASE", help="release.dsse.json or its folder.")]
PublicKeyOpt = Annotated[Path, public_key_option("The signer's Ed25519 public key (PEM).")]
DataOpt = Annotated[
    list[Path] | None, typer.Option(metavar="FILE", help="Data file(s) to check against the keyed digest.")
]
DataKeyOpt = Annotated[Path | None, data_key_option("The data owner's HMAC key (with --data).", says_default=False)]
BaseModelOpt = Annotated[
    Path | None,
    typer.Option(metavar="PATH", help="Base model folder or .gguf file to check against the recorded digests."),
]
AllowNonPrivateOpt = Annotated[bool, allow_non_private_option("Exit 0 for an intact non-private (control) record.")]
AsJsonOpt = Annotated[bool, json_option("one JSON document instead of lines.")]
SyntheticOpt = Annotated[
    Path | None,
    typer.Option(metavar="FILE", help="Also check a synthetic file (dplora synth), its manifest and chain."),
]
ExportOpt = Annotated[
    Path | None,
    typer.Option(metavar="DIR", help="Also check a dplora export folder; with --base-model, redo the merge."),
]
ManifestOpt = Annotated[
    Path | None, typer.Option(metavar="PATH", help="The synthetic file's manifest. Default: FILE.dsse.json.")
]


def verify(
    release_path: ReleasePathArg,
    public_key: PublicKeyOpt,
    data: DataOpt = None,
    data_key: DataKeyOpt = None,
    base_model: BaseModelOpt = None,
    allow_non_private: AllowNonPrivateOpt = False,
    as_json: AsJsonOpt = False,
    synthetic: SyntheticOpt = None,
    manifest: ManifestOpt = None,
    export: ExportOpt = None,
) -> None:
    """Check a release: signature, artifact digests, and optionally the keyed data digest and the base model.

    A non-private control run's record prints NOT DIFFERENTIALLY PRIVATE and exits 6 unless --allow-non-private.
    --synthetic FILE also checks a dplora synth file: its signed manifest, its sha256 and that it names this release.
    --export DIR checks a dplora export folder the same way; with --base-model DIR it also redoes the merge.
    """
    from dplora.release.verify import shipping_note

    inputs = (release_path, public_key, data, data_key, base_model, synthetic, manifest)
    result, public, synth = _verified(*inputs, as_json=as_json)
    exported = _exported(export, release_path, result, public, base_model, as_json=as_json) if export else None
    checks = _verify_checks(result, public_key, public, data or [], base_model) + (synth.checks if synth else [])
    checks += exported.checks if exported else []
    shipping = shipping_note(release_path if release_path.is_dir() else release_path.parent)
    code = 0 if result.differentially_private or allow_non_private else 6
    code = 5 if code == 0 and result.audit and result.audit.get("violation") else code  # the attached audit failed
    if as_json:
        _emit(result, synth, checks, shipping, code, release_path, exported)
    else:
        _print(result, synth, checks, shipping)
        if exported:
            out.print(exported.line, markup=False, soft_wrap=True)
    if code:
        raise typer.Exit(code=code)


def _verified(release_path, public_key, data, data_key, base_model, synthetic, manifest, *, as_json: bool):
    """Verify the release (and the synthetic file): (result, the public key, the synthetic check or None)."""
    from dplora.release.envelope import load_data_key
    from dplora.release.keys import load_public_key
    from dplora.release.verify import verify_release

    if data_key is not None and not data:
        no_data = BadInputError("--data-key needs --data FILE: the data file(s) whose keyed digest to check")
        raise fail(no_data, as_json=as_json)
    try:
        key = load_data_key(data_key) if data else None
        public = load_public_key(public_key)
        result = verify_release(release_path, public_key, data_files=data or None, data_key=key, base_model=base_model)
        synth = check_synthetic(synthetic, manifest, release_path, result, public) if synthetic else None
    except DploraError as err:
        raise fail(err, as_json=as_json) from None
    return result, public, synth


def _exported(folder, release_path, result, public, base_model, *, as_json: bool):
    """The ``--export`` check: verify's parts for the export folder, or a one-line failure."""
    try:
        return check_export(folder, release_path, result, public, base_model)
    except DploraError as err:
        raise fail(err, as_json=as_json) from None


def _emit(result, synth, checks, shipping: str, code: int, release_path: Path, exported=None) -> None:
    """``verify --json``: one document with the checks, the claims, the audit and the exit code's reason."""
    from dplora.audit.attach import summary_line

    doc = {"ok": code == 0, "release": str(release_path), "differentially_private": result.differentially_private}
    if code:
        doc |= {"exit_code": code, "error": summary_line(result.audit) if code == 5 else _claim_line(result)}
    doc |= {"synthetic": synth.claims} if synth else {}
    doc |= {"export": exported.claims} if exported else {}
    doc |= {"shipping": shipping}
    emit_json(doc | {"checks": checks, "claims": _claims(result), "audit": result.audit})


def _print(result, synth, checks: list[dict], shipping: str) -> None:
    """``verify``'s lines: one per check, the shipping note, the claim, the audit, the tuning and synthetic lines."""
    from dplora.audit.attach import composed_line, summary_line

    for c in checks:
        out.print(f"{'OK' if c['ok'] else '--'}  {c['check']}: {c['detail']}", markup=False, soft_wrap=True)
    if execution := _execution_line(result.statement):  # how it ran: before the shipping note and the claim
        out.print(execution, markup=False, soft_wrap=True)
    out.print(shipping, markup=False, soft_wrap=True)
    out.print(_claim_line(result), markup=False, soft_wrap=True)
    if result.audit is not None:
        out.print(summary_line(result.audit), markup=False, soft_wrap=True)
    if composed := composed_line(result.statement.get("predicate")):
        out.print(composed, markup=False, soft_wrap=True)
    if tuning := _tuning_line(result.statement):
        out.print(tuning, markup=False, soft_wrap=True)
    if lora := _lora_line(result.statement):
        out.print(lora, markup=False, soft_wrap=True)
    if warm := _warm_start_line(result.statement):
        out.print(warm, markup=False, soft_wrap=True)
    if synth:
        out.print(synth.line, markup=False, soft_wrap=True)


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
    if result.attack_ceiling is not None:
        from dplora.accounting.ceiling import ceiling_sentence
        from dplora.release.card import CEILING_UNIT_WORDS

        unit = (statement.get("predicate", {}).get("privacy") or {}).get("protected_unit")
        said = ceiling_sentence(result.attack_ceiling, CEILING_UNIT_WORDS.get(unit, "one protected unit was used"))
        how = "recomputed from the record's q, σ, T and adjacency"
        if isinstance(statement.get("predicate", {}).get("tuning"), dict):  # a sweep: every trial composed
            how = "recomputed from every sweep trial's q, σ, T and adjacency, composed"
        if result.ceiling_recorded:
            checks.append(("attack ceiling", True, f"{how}; equals the recorded one: {said}"))
        else:
            checks.append(("attack ceiling", False, f"not recorded (an older release); {how}: {said}"))
    return [{"check": name, "ok": ok, "detail": detail} for name, ok, detail in checks]


def _claim_line(result) -> str:
    """What the release claims, in one line (a non-private control says so)."""
    statement = result.statement
    if not result.differentially_private:
        from dplora.mechanism.control import NOT_DP

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


def _lora_line(statement: dict) -> str | None:
    """A release trained with ``lora.freeze_a`` (FFA-LoRA) says so in one line; None otherwise."""
    predicate = statement.get("predicate") or {}
    if not (predicate.get("lora") or {}).get("freeze_a"):
        return None
    seed = (predicate.get("seed") or {}).get("value")
    return (
        f"lora: A frozen (lora.freeze_a, FFA-LoRA): every LoRA A stays at its initialisation under the recorded seed "
        f"{seed}; only B was trained, clipped and noised"
    )


def _execution_line(statement: dict) -> str | None:
    """How the run executed: its world size and launcher, and where the base weights lived (``training.sharding``:
    ``fsdp`` with each rank's share of the base); None for a record without an execution entry."""
    execution = (statement.get("predicate") or {}).get("execution") or {}
    if "world_size" not in execution:
        return None
    line = f"execution: {execution['world_size']} process(es) ({execution.get('launcher', 'unknown')})"
    line += f", base sharding {execution.get('base_sharding', 'none')}"
    held = [
        r["base_parameters_held"]
        for r in (execution.get("distributed") or {}).get("ranks", [])
        if "base_parameters_held" in r
    ]
    if held:
        line += f" (base parameters held per rank: {', '.join(f'{n:,}' for n in held)})"
    return line


def _warm_start_line(statement: dict) -> str | None:
    """A release trained after a public warm start (``data.public_warm_start``) names the public file, its sha256
    and the settings in one line; None otherwise."""
    warm = (statement.get("predicate") or {}).get("public_warm_start")
    if not isinstance(warm, dict):
        return None
    return (
        f"public warm start: {warm.get('file')} (sha256 {warm.get('sha256')}), {warm.get('steps')} steps of "
        f"{warm.get('batch_size')} records at lr {warm.get('lr')}, no noise; declared public by the contract and "
        "charged no ε (declaring private data public voids the guarantee)"
    )


def _claims(result) -> dict:
    """What a verified release claims (``verify --json``): the unit, the accounting, the run id, the files and the
    attack ceiling as recomputed (equal to the recorded one, or verify failed)."""
    statement = result.statement
    predicate = statement["predicate"]
    acc, unit = predicate.get("accounting") or {}, predicate.get("privacy") or {}
    keys = ("epsilon_spent", "target_epsilon", "delta", "accountant", "accountant_version", "steps_done")
    return {
        "run_id": predicate.get("run_id"),
        "protected_unit": unit.get("protected_unit"),
        "adjacency": unit.get("adjacency"),
        **{k: acc.get(k) for k in keys},
        "artifacts": [s["name"] for s in statement["subject"]],
        **({"attack_ceiling": result.attack_ceiling} if result.attack_ceiling is not None else {}),
        "lora_freeze_a": bool((predicate.get("lora") or {}).get("freeze_a")),
        **({"public_warm_start": predicate["public_warm_start"]} if "public_warm_start" in predicate else {}),
        "world_size": (predicate.get("execution") or {}).get("world_size"),
        "base_sharding": (predicate.get("execution") or {}).get("base_sharding", "none"),
        **({"tuning": predicate["tuning"]} if "tuning" in predicate else {}),
        **(
            {"composed_with_audit": (predicate.get("audit") or {})["composed"]}
            if (predicate.get("audit") or {}).get("composed")
            else {}
        ),
    }
