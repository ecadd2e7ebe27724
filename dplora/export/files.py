"""``dplora export``: a release as a merged model (``merge``) or its adapter folder (``peft``), with a signed manifest.

Merging is post-processing of the released adapters with the public base model, so the export carries the
release's (ε, δ) at its protected unit and no more (Dwork & Roth 2014, Proposition 2.1). The chain is the one
``dplora synth`` signs (:mod:`dplora.synth.files`): a DSSE v1 envelope over an in-toto Statement v1, signed with the
same key and code (:func:`dplora.release.envelope.sign_statement`), whose subjects are every output file (sha256)
and whose predicate names the source release by its record digest (sha256 of the release's DSSE payload) and the
base model by the sha256 of its files (the digests the record names; another base is refused).

Output folder ``DIR``: ``merge``: ``model*.safetensors`` (+ index), ``config.json``, ``generation_config.json``,
the tokenizer files and its chat template, as ``transformers`` writes them (``save_pretrained``); ``peft``: the
release's ``adapter/`` files as they are. Beside them ``dplora-export.dsse.json`` (:data:`MANIFEST_NAME`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

from dplora.data.digest import sha256_file
from dplora.errors import BadInputError, NotPrivateError, VerificationError
from dplora.run.outputs import fix_mtimes

EXPORT_PREDICATE_TYPE = "https://dplora.dev/export/v1"
NON_PRIVATE_EXPORT_PREDICATE_TYPE = "https://dplora.dev/export-non-private/v1"
EXPORT_PREDICATE_TYPES = (EXPORT_PREDICATE_TYPE, NON_PRIVATE_EXPORT_PREDICATE_TYPE)
MANIFEST_NAME = "dplora-export.dsse.json"
FORMATS = ("merge", "peft")
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExportResult:
    """What :func:`export_release` wrote: the folder, its manifest, the format, the files and the privacy."""

    out: Path
    manifest: Path
    format: str
    files: tuple[str, ...]
    differentially_private: bool
    guarantee: str
    dtype: str | None


def base_folder(run, base_model: Path | None, log=print) -> Path:
    """The base-model folder to merge into: ``base_model`` if given, else the one the run's contract resolves to.

    Raises:
        BadInputError: no such folder, or a .gguf base (quantized: a merge into it would not be exact).
    """
    from dplora.engine.model import resolve_model

    if base_model is not None:
        folder = Path(base_model)
        if folder.is_file() and folder.suffix == ".gguf":
            folder, gguf = folder.parent, folder.name
        else:
            gguf = None
    else:
        folder, gguf = resolve_model(run.contract.model, log)
    if gguf is not None:
        raise BadInputError(
            f"the base {gguf} is a quantized GGUF file: a merge into it is not exact; export --format peft, or "
            "merge into a full-precision folder of the same weights (--base-model DIR)"
        )
    if not (folder / "config.json").is_file():
        raise BadInputError(f"--base-model {folder}: not a Hugging Face model folder (no config.json)")
    return folder


def _carry_training_template(tokenizer, data) -> None:
    """Give the merged model's tokenizer the chat template training rendered records with, where the base model
    had none: conversations on such a model train through dplora's plain fallback
    (:data:`dplora.data.chat.PLAIN_TEMPLATE`), and without it in ``tokenizer_config.json`` the served model's
    ``apply_chat_template`` would fail or format otherwise than ``dplora generate``. A model's own template and the
    raw text formats are left as they are."""
    from dplora.data.chat import PLAIN_TEMPLATE, model_template, template_in_use

    if model_template(tokenizer) is None and template_in_use(tokenizer, data) == PLAIN_TEMPLATE:
        tokenizer.chat_template = PLAIN_TEMPLATE


def merged_model(base: Path, adapter: Path):
    """The base at ``base`` (in its own dtype) with the adapters at ``adapter`` merged in (peft ``merge_and_unload``).

    Returns:
        (merged ``PreTrainedModel`` on CPU, tokenizer, dtype name such as ``"float32"``).
    Raises:
        BadInputError: the base or the adapters cannot be loaded.
    """
    import warnings

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dplora.engine.hubkernels import no_hub_kernels
    from dplora.engine.model import quiet_transformers

    quiet_transformers()
    if (Path(base) / "adapter_config.json").exists():  # transformers would load that adapter onto the base too
        raise BadInputError(f"{base} holds an adapter_config.json: give the plain base model folder")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype="auto", local_files_only=True, **no_hub_kernels())
        tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        from dplora.engine.model import load_error

        raise load_error(Path(base), err) from None
    dtype = str(model.dtype).removeprefix("torch.")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Unexpected keyword arguments")  # a control's privacy note
        # peft asks transformers' deprecated is_gradient_checkpointing (transformers 5.2x): not the user's to act on
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        try:
            peft_model = PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
        except (OSError, ValueError, KeyError, RuntimeError) as err:
            raise BadInputError(f"cannot load the adapters in {adapter}: {err.__class__.__name__}") from None
        merged = peft_model.merge_and_unload()
    merged.eval()
    return merged, tokenizer, dtype


def _public_mtimes(folder: Path, started_at: str | None) -> None:
    """Stamp the export's files with the release's ``started_at`` (taken before the data was read): a real mtime
    is the export's end, which after a CI job's training step times the private run."""
    if started_at:
        fix_mtimes(folder, started_at)


LOCAL_BASE_NOTE = (
    "adapter_config.json names the base model's folder on the machine that exported it, so that peft's "
    "AutoPeftModelForCausalLM loads it there; the signed release names the base by a Hub id or folder name only"
)


def _name_local_base(folder: Path, predicate: dict, base: Path) -> None:
    """Point the copied ``adapter_config.json`` at ``base`` (absolute), after checking that ``base`` holds the
    files the record names (the base the adapters were trained on).

    Raises:
        VerificationError: ``base`` is not that base (exit 3).
        BadInputError: a ``.gguf`` base (peft loads a folder) or an unreadable adapter config.
    """
    from dplora.release.verify import check_base_model

    if Path(base).is_file():
        raise BadInputError("--local-base needs a base folder; a .gguf file cannot be loaded by peft's Auto class")
    try:
        check_base_model(predicate, base)
    except VerificationError as err:
        raise VerificationError(f"not the base this release was trained on: {err}") from None
    path = folder / "adapter_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise BadInputError(f"cannot read {path.name} of the release's adapter") from None
    config["base_model_name_or_path"] = str(Path(base).resolve())
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _check_out(out: Path, run_folder: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInputError(f"--out {out}: exists and is not an empty folder (nothing was written)")
    ancestor = out.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent  # missing parents are created once every check has passed (as `train` does)
    if not ancestor.is_dir():
        raise BadInputError(f"--out {out}: {ancestor} is not a folder")
    if out.resolve().is_relative_to(run_folder.resolve()):
        raise BadInputError(f"--out {out}: write outside the run folder (an unsigned file there fails verify)")


def export_release(
    target: Path,
    *,
    out: Path,
    fmt: str,
    private_key,
    public_key=None,
    base_model: Path | None = None,
    local_base: bool = False,
    allow_control: bool = False,
    log=print,
) -> ExportResult:
    """Export the run ``target``'s release to ``out`` as a merged model or its adapter folder, and sign a manifest.

    Checks first, writing nothing on failure: the release verifies (:func:`dplora.release.verify.verify_release`)
    with ``public_key`` (default: the signing key's public half); for ``merge``, the base folder's files equal the
    record's ``base_model.files`` sha256 digests (another base is refused) and are not a quantized GGUF.

    Args:
        target: a finished run folder or its contract.
        out: a new (or empty) folder outside the run folder.
        fmt: ``"merge"`` (``merge_and_unload`` in the base's dtype, safetensors) or ``"peft"`` (adapter copied).
        private_key: Ed25519 signing key for the manifest (:func:`dplora.release.keys.load_private_key`).
        public_key: the release signer's Ed25519 public key or its PEM path.
        base_model: the base folder to merge into (default: the contract's model).
        local_base: ``peft`` only: the copy's ``adapter_config.json`` names the absolute path of the base folder
            on this machine (checked against the record's digests first), so that peft's
            ``AutoPeftModelForCausalLM.from_pretrained(out)`` loads it here; the release itself keeps a name
            (never a machine path). The manifest says so (``local_base: true``) but holds no path.
        allow_control: export a non-private control (labelled NO DP GUARANTEE in the manifest).

    Returns:
        :class:`ExportResult`.
    Raises:
        BadInputError: bad settings, out folder, base or adapters (exit 2).
        VerificationError: the release does not verify, or the base is not the one trained on (exit 3).
        NotPrivateError: a non-private control without ``allow_control`` (exit 6).
    """
    from dplora.mechanism.control import NOT_DP
    from dplora.release.derived import NO_DP_GUARANTEE, guarantee_text, release_payload, source_release_entry
    from dplora.release.envelope import RELEASE_FILENAME, STATEMENT_TYPE, sign_statement, temp_json
    from dplora.release.keys import load_public_key
    from dplora.release.read import ADAPTER_DIR, read_run
    from dplora.release.verify import check_base_model, verify_release

    if fmt not in FORMATS:
        raise BadInputError(f"--format {fmt}: allowed values are {', '.join(FORMATS)}")
    if local_base and fmt != "peft":
        raise BadInputError("--local-base goes with --format peft (a merged model needs no base)")
    out = Path(out)
    run = read_run(target)
    _check_out(out, run.folder)
    if not run.differentially_private:
        if not allow_control:
            raise NotPrivateError(
                f"{run.folder} is {NOT_DP} (a privacy.enabled=false control): pass --allow-control to export it "
                f"anyway (labelled {NO_DP_GUARANTEE})"
            )
        log(f"warning: {run.folder} is {NOT_DP}: the export is labelled {NO_DP_GUARANTEE}")
    if public_key is None:
        public_key = private_key.public_key()
    elif not hasattr(public_key, "verify"):
        public_key = load_public_key(Path(public_key))
    try:
        verified = verify_release(run.folder, public_key)
    except VerificationError as err:
        raise VerificationError(f"the release in {run.folder} does not verify: {err}") from None
    predicate = verified.statement["predicate"]
    base_entry = predicate.get("base_model") or {}
    adapter = run.folder / ADAPTER_DIR
    payload, statement = release_payload(run.folder / RELEASE_FILENAME)
    private = run.differentially_private
    guarantee = guarantee_text(statement["predicate"], private=private, what="exported model")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        dtype = None
        if fmt == "merge":
            base = base_folder(run, base_model, log)
            try:
                check_base_model(predicate, base)
            except VerificationError as err:
                raise VerificationError(f"not the base this release was trained on: {err}") from None
            model, tokenizer, dtype = merged_model(base, adapter)
            _carry_training_template(tokenizer, run.contract.data)
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
        else:
            for p in sorted(adapter.iterdir()):
                if p.is_file():
                    shutil.copy2(p, tmp / p.name)
            if local_base:
                _name_local_base(tmp, predicate, base_folder(run, base_model, log))
        names = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        subject = [{"name": n, "digest": {"sha256": sha256_file(tmp / n)}} for n in names]
        export_predicate = {
            "differentially_private": private,
            "guarantee": guarantee,
            "source_release": source_release_entry(payload, statement, run.folder.name),
            "format": fmt,
            "base_model": {
                k: base_entry.get(k) for k in ("name_or_path", "revision", "commit", "files") if k in base_entry
            },
            "merge": {"method": "peft merge_and_unload", "dtype": dtype} if fmt == "merge" else None,
        }
        if local_base:
            export_predicate["local_base"] = True
            export_predicate["local_base_note"] = LOCAL_BASE_NOTE
        if not private:
            export_predicate["warning"] = NO_DP_GUARANTEE
        ptype = EXPORT_PREDICATE_TYPE if private else NON_PRIVATE_EXPORT_PREDICATE_TYPE
        manifest = {"_type": STATEMENT_TYPE, "subject": subject, "predicateType": ptype, "predicate": export_predicate}
        man_tmp = temp_json(tmp, MANIFEST_NAME, sign_statement(manifest, private_key))
        os.replace(man_tmp, tmp / MANIFEST_NAME)
        _public_mtimes(tmp, statement["predicate"].get("started_at"))
        if out.is_dir():
            out.rmdir()  # empty (checked): replaced by the finished folder
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(
        out=out,
        manifest=out / MANIFEST_NAME,
        format=fmt,
        files=tuple(names),
        differentially_private=private,
        guarantee=guarantee,
        dtype=DTYPES.get(dtype, dtype) if dtype else None,
    )
