"""Synthetic records from a release (``dplora synth``), with a signed manifest chaining them to that release.

Generation uses the base model + the released adapters only (:mod:`dplora.evaluate.generate`), prompted from a public
file the user declares public (``--prompts``); nothing from the private data enters generation. The output is
post-processing of the release, so it carries the release's (ε, δ) at its protected unit and no more
(Dwork & Roth 2014, Proposition 2.1; the recipe of Yue et al. 2023, arXiv 2210.14348).

Output: ``FILE`` (csv or jsonl, the training data's columns: prompt and response, or text; or, with
``record_format="messages"`` (the default for a conversations run), jsonl conversations in the run's
``data.messages_column`` (else ``messages``): the public prompt as the user turn, the generated reply as the
assistant turn, the record format ``dplora train`` reads under a ``data.record_format: messages`` contract) and
beside it ``FILE.dsse.json``, a DSSE v1 envelope (same envelope and key handling as
:mod:`dplora.release.envelope`) over an in-toto
Statement v1 whose subject is ``FILE`` (sha256) and whose predicate names the source release by its record
digest (sha256 of the release's DSSE payload), the generation settings, the row count and the inherited
guarantee in words. From a non-private control (``privacy.enabled: false``), only with ``allow_non_private``:
every row gets a ``dp_guarantee`` column reading ``NO DP GUARANTEE``, and the manifest says so under its own
predicate type.

Verbatim check: the synthetic rows are compared with the run's data file (``synthesize`` refuses to run without
it); the counts and the flagged row numbers (never the text) go to ``<run>.private/synth/FILE.memorisation.json`` and
the private log, never beside the shippable file. They are a function of the private data and NOT covered by DP, so
they stay out of the signed manifest and off a public log (:mod:`dplora.surface`): do not share them.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from pathlib import Path

from dplora.contract.spec import DEFAULT_MESSAGES_COLUMN, DataSection
from dplora.data.digest import sha256_file
from dplora.errors import BadInputError, NotPrivateError, VerificationError, excerpt
from dplora.evaluate.generate import Sampling
from dplora.release.derived import NO_DP_GUARANTEE, guarantee_text, release_payload, source_release_entry
from dplora.release.locate import ReleaseInputs, locate_inputs
from dplora.run.outputs import private_folder, private_path

SYNTH_PREDICATE_TYPE = "https://dplora.dev/synthetic/v1"
NON_PRIVATE_SYNTH_PREDICATE_TYPE = "https://dplora.dev/synthetic-non-private/v1"
SYNTH_PREDICATE_TYPES = (SYNTH_PREDICATE_TYPE, NON_PRIVATE_SYNTH_PREDICATE_TYPE)
MARKER_COLUMN = "dp_guarantee"  # added to every row of a file drawn from a non-private control
MANIFEST_SUFFIX = ".dsse.json"
REPORT_SUFFIX = ".memorisation.json"
FORMATS = (".csv", ".jsonl")
RECORD_FORMATS = ("auto", "columns", "messages")  # auto: messages for a conversations run, else the run's columns


def manifest_path(out: Path) -> Path:
    """The manifest beside a synthetic file: ``FILE.dsse.json``."""
    return Path(out).with_name(Path(out).name + MANIFEST_SUFFIX)


def report_path(out: Path, run_folder: Path) -> Path:
    """The memorisation report of synthetic file ``out`` from run ``run_folder``:
    ``<run>.private/synth/FILE.memorisation.json`` (private, not signed; never beside the shippable file)."""
    return private_path(Path(run_folder)) / "synth" / (Path(out).name + REPORT_SUFFIX)


def _public_mtimes(paths, started_at: str | None) -> None:
    """Stamp ``paths`` with the release's ``started_at`` (taken before the data was read): a real mtime is the end
    of the synth step, which follows training and reads the training data for the verbatim check."""
    if not started_at:
        return
    from datetime import datetime

    stamp = datetime.fromisoformat(started_at).timestamp()
    for path in paths:
        os.utime(path, (stamp, stamp))


def read_public_prompts(path: Path, column: str) -> list[str]:
    """Public prompts: a csv's ``column`` (else its ``prompt`` column), or one prompt per non-empty line.

    Raises:
        BadInputError: unreadable file, no such column, no prompt.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise BadInputError(f"cannot read --prompts {path}: {err.__class__.__name__}") from None
    if Path(path).suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        names = reader.fieldnames or []
        col = column if column in names else "prompt" if "prompt" in names else None
        if col is None:
            raise BadInputError(f"--prompts {path} has no column {column!r} or 'prompt'; columns: {', '.join(names)}")
        prompts = [row[col] for row in reader if (row.get(col) or "").strip()]
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise BadInputError(f"--prompts {path} holds no prompt")
    return prompts


@dataclasses.dataclass(frozen=True, kw_only=True)
class SynthResult:
    """What :func:`synthesize` wrote: the file, its manifest and report, rows, and the verbatim counts."""

    out: Path
    manifest: Path
    report: Path
    rows: int
    differentially_private: bool
    guarantee: str
    memorisation: dict


def _columns(data: DataSection) -> tuple[str, str | None]:
    """(prompt-or-text column, response column or None) of the run's data section; a conversations run:
    (``prompt``, ``response``)."""
    if data.kind == "messages":
        return "prompt", "response"
    return (data.text_column, None) if data.text_column else (data.prompt_column, data.response_column)


def resolve_record_format(data: DataSection, record_format: str) -> str:
    """``columns`` or ``messages``: what :func:`build_rows` writes for ``record_format`` (``auto`` follows the run).

    Raises:
        BadInputError: a value outside :data:`RECORD_FORMATS`.
    """
    if record_format not in RECORD_FORMATS:
        raise BadInputError(f"--format={excerpt(str(record_format))}: give one of {', '.join(RECORD_FORMATS)}")
    if record_format == "auto":
        return "messages" if data.kind == "messages" else "columns"
    return record_format


def messages_column(data: DataSection) -> str:
    """The conversation column a ``messages`` synthetic file uses: the run's ``data.messages_key`` or ``messages``."""
    return data.messages_key or DEFAULT_MESSAGES_COLUMN


def build_rows(
    data: DataSection, prompts: list[str], generated: list[str], *, private: bool, record_format: str = "columns"
) -> list[dict]:
    """Rows in the training schema: {prompt, response} or {text: prompt + continuation}; plus the marker if not DP.

    ``record_format="messages"``: one conversation per row, ``{messages_column: [{"role": "user", "content":
    prompt}, {"role": "assistant", "content": generated}]}`` (TRL/OpenAI ``messages`` format), plus the marker.
    """
    first, response = _columns(data)
    column = messages_column(data)
    rows = []
    for prompt, gen in zip(prompts, generated, strict=True):
        if record_format == "messages" and data.completion_column is not None:  # TRL prompt/completion
            row = {
                column: [{"role": "user", "content": prompt}],
                data.completion_column: [{"role": "assistant", "content": gen}],
            }
        elif record_format == "messages":
            row = {column: [{"role": "user", "content": prompt}, {"role": "assistant", "content": gen}]}
        else:
            row = {first: prompt + gen} if response is None else {first: prompt, response: gen}
        if not private:
            row[MARKER_COLUMN] = NO_DP_GUARANTEE
        rows.append(row)
    return rows


def serialize_rows(rows: list[dict], fmt: str) -> bytes:
    """csv (header row, every field quoted, RFC 4180) or jsonl (one UTF-8 JSON object per line)."""
    if fmt == ".jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    buf = io.StringIO()
    # every field quoted: a generated "\r" or "\n" stays inside its cell for any csv reader
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n", quoting=csv.QUOTE_ALL)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode("utf-8")


def _canonical(conversation) -> str:
    """A conversation as one comparable string (roles and contents only)."""
    return json.dumps([[m["role"], m["content"]] for m in conversation], ensure_ascii=False)


def memorisation_counts(
    rows: list[dict], data: DataSection, log=print, *, unit_key: str | None = None, table=None
) -> dict:
    """Synthetic rows equal to a training row (whole record) or whose generated field equals one: counts and
    the synthetic rows' 0-based indices (so the data owner can drop them), never text.

    ``rows`` are in the training schema (:func:`build_rows` with the run's own record format): for a conversations
    run, a row matches when its conversation equals a training conversation (roles and contents), and its generated
    field when its last (assistant) turn equals any assistant turn of the training data.

    Reads the run's data file (``data.path``, held-out rows included) only to compare. When the file cannot be
    read, says so (``"checked": False``); :func:`synthesize` refuses to run then. ``table``: the data already
    loaded (:func:`dplora.data.units.load_table`). Exact string equality (no normalisation). ``data`` is the run's
    data section and ``unit_key`` its ``privacy.unit_key`` (the file is read as training reads it).
    """
    from dplora.data.units import load_table

    try:
        table = load_table(data, unit_key=unit_key) if table is None else table
    except BadInputError:
        return {"checked": False, "note": "the training data file is not readable here: verbatim check not run"}
    if data.kind == "messages":  # whole conversations, and the generated reply against every assistant turn
        key, tail = data.messages_key, data.completion_column
        generated = f"{tail or key} (assistant turns)"
        whole = [list(c) + (list(table[tail][i]) if tail else []) for i, c in enumerate(table[key])]
        train_rows = {_canonical(c) for c in whole}
        train_generated = {m["content"] for c in whole for m in c if m["role"] == "assistant"}

        def conversation(r):
            return list(r[key]) + (list(r[tail]) if tail else [])

        row_hits = [i for i, r in enumerate(rows) if _canonical(conversation(r)) in train_rows]
        field_hits = [i for i, r in enumerate(rows) if conversation(r)[-1]["content"] in train_generated]
    else:
        first, response = _columns(data)
        generated = response or first
        cols = [first, response] if response else [first]
        train_rows = set(zip(*(table[c] for c in cols), strict=True))
        train_generated = set(table[generated])
        row_hits = [i for i, r in enumerate(rows) if tuple(r[c] for c in cols) in train_rows]
        field_hits = [i for i, r in enumerate(rows) if r[generated] in train_generated]
    exact_rows, exact_generated = len(row_hits), len(field_hits)
    counts = {
        "checked": True,
        "rows": len(rows),
        "training_rows": table.num_rows,
        "exact_row_matches": exact_rows,
        "exact_generated_field_matches": exact_generated,
        "generated_field": generated,
        "flagged_rows": row_hits,  # synthetic row indices (0-based) equal to a training row as a whole
        "flagged_generated_rows": field_hits,  # synthetic row indices whose generated field equals a training row's
        "note": "counts of the private data, not covered by DP: keep this file with the data owner",
    }
    if exact_rows or exact_generated:  # ``log`` is the private log: these are counts of the private data
        log(
            f"warning: {exact_rows} synthetic rows equal a training row verbatim and {exact_generated} have a "
            f"{generated!r} equal to a training row's (flagged by row number in the {REPORT_SUFFIX} report)"
        )
    return counts


def synthesize(
    target: Path,
    *,
    rows: int,
    out: Path,
    prompts_file: Path | None,
    sampling: Sampling,
    private_key,
    allow_non_private: bool = False,
    threads: int | None = None,
    record_format: str = "auto",
    log=print,
    private_log=None,
    inputs: ReleaseInputs | None = None,
) -> SynthResult:
    """Generate ``rows`` synthetic records from the run ``target``'s release and sign their manifest.

    Args:
        target: a finished run folder or its contract.
        inputs: ``--data``, ``--model`` and ``--data-key`` for a moved release: the data and base model are found
            by :func:`dplora.release.locate.locate_inputs` (checked against the verified record's digests).
        rows: records to write (≥ 1); prompt i is the public prompt i mod (number of prompts).
        out: the synthetic file, ``.csv`` or ``.jsonl``; ``out.dsse.json`` beside it, and the memorisation report
            in the run's private folder (:func:`report_path`).
        prompts_file: public prompts (csv column named as the training prompt/text column, or ``prompt``; or
            one per line).
        sampling: decoding settings (:class:`dplora.evaluate.generate.Sampling`).
        private_key: the Ed25519 signing key (:func:`dplora.release.keys.load_private_key`).
        record_format: ``auto`` (conversations for a ``messages`` run, else the run's columns), ``columns`` or
            ``messages`` (jsonl conversations, user turn = public prompt, assistant turn = generated reply; needs a
            ``.jsonl`` FILE).
        log: the public one-line sink; private_log: the sink of the verbatim-match warning (a
            :class:`dplora.surface.PrivateLog`; None: not printed, the counts are in the report only).

    Returns:
        :class:`SynthResult`.

    Raises:
        BadInputError: bad settings, no prompts, no release, data or model not found (naming the option to give),
            a given file that differs from the record's digest, unloadable model (exit 2); nothing is written.
        VerificationError: the release does not verify with the signing key's public half (exit 3): the
            manifest would chain to adapters nobody signed.
        NotPrivateError: a non-private control without ``allow_non_private`` (exit 6).
    """
    from dplora.data.units import load_table
    from dplora.evaluate.generate import generate_replies
    from dplora.mechanism.control import NOT_DP
    from dplora.release.envelope import RELEASE_FILENAME, STATEMENT_TYPE, sign_statement, temp_json, write_temp
    from dplora.release.read import load_adapter_model, read_run
    from dplora.release.verify import verify_release

    out = Path(out)
    if rows < 1:
        raise BadInputError(f"--rows={rows}: must be at least 1")
    if out.suffix.lower() not in FORMATS:
        raise BadInputError(f"--out {out}: give a .csv or .jsonl file")
    if not out.parent.is_dir():
        raise BadInputError(f"--out {out}: folder {out.parent} does not exist")
    if prompts_file is None:
        raise BadInputError("give --prompts FILE: public prompts or control codes (nothing private enters generation)")
    run = read_run(target)
    fmt = resolve_record_format(run.contract.data, record_format)
    if fmt == "messages" and out.suffix.lower() != ".jsonl":
        raise BadInputError(f"--out {out}: conversations (--format messages) are written as .jsonl, not csv")
    if out.resolve().is_relative_to(run.folder.resolve()):
        raise BadInputError(f"--out {out}: write outside the run folder (an unsigned file there fails verify)")
    if not run.differentially_private:
        if not allow_non_private:
            raise NotPrivateError(
                f"{run.folder} is {NOT_DP} (a privacy.enabled=false control): "
                "pass --allow-non-private to synthesize from it anyway (marked NO DP GUARANTEE)"
            )
        log(f"warning: {run.folder} is {NOT_DP}: the synthetic file is marked {NO_DP_GUARANTEE}")
    try:  # the adapters used must be the signed ones: the manifest chains to this release
        verify_release(run.folder, private_key.public_key())
    except VerificationError as err:
        raise VerificationError(f"the release in {run.folder} does not verify with the signing key: {err}") from None
    first, _ = _columns(run.contract.data)
    public = read_public_prompts(prompts_file, first)
    prompts = [public[i % len(public)] for i in range(rows)]
    payload, statement = release_payload(run.folder / RELEASE_FILENAME)
    private = run.differentially_private
    guarantee = guarantee_text(statement["predicate"], private=private)
    # found after the release verifies: a given file is checked against the signed record's digests
    why = "synth flags rows equal to a training row, so it needs the run's data"
    run = locate_inputs(run, inputs or ReleaseInputs(), data=True, data_for=why, log=log)
    try:  # the verbatim check runs on every file: no row equal to a training row goes unflagged
        table = load_table(run.contract.data, unit_key=run.contract.privacy.unit_key)
    except BadInputError as err:
        raise BadInputError(f"synth flags rows equal to a training row, so it needs the run's data: {err}") from None
    model, tokenizer, device = load_adapter_model(run, threads=threads, log=log)
    generated = generate_replies(
        model,
        tokenizer,
        prompts,
        data=run.contract.data,
        training=run.contract.training,
        sampling=sampling,
        device=device,
    )
    records = build_rows(run.contract.data, prompts, generated, private=private, record_format=fmt)
    own = "messages" if run.contract.data.kind == "messages" else "columns"  # compared in the training schema
    view = records if fmt == own else build_rows(run.contract.data, prompts, generated, private=True, record_format=own)
    memo = memorisation_counts(view, run.contract.data, log=private_log or (lambda _m: None), table=table)
    memo["dp_guarantee"] = guarantee if private else NO_DP_GUARANTEE
    data = serialize_rows(records, out.suffix.lower())
    predicate = {
        "differentially_private": private,
        "guarantee": guarantee,
        "source_release": source_release_entry(payload, statement, run.folder.name),
        "rows": rows,
        "format": out.suffix.lower().lstrip("."),
        "record_format": "messages" if fmt == "messages" else run.contract.data.kind,
        "columns": list(records[0]),
        "generation": {
            "max_new_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "prompts_file": {"name": Path(prompts_file).name, "sha256": sha256_file(Path(prompts_file))},
            "prompts": len(public),
            "base_model": (statement["predicate"].get("base_model") or {}).get("name_or_path"),
        },
    }
    if not private:
        predicate["warning"] = NO_DP_GUARANTEE
    tmp = write_temp(out.parent, out.name, data)
    try:
        subject = [{"name": out.name, "digest": {"sha256": sha256_file(tmp)}}]
        ptype = SYNTH_PREDICATE_TYPE if private else NON_PRIVATE_SYNTH_PREDICATE_TYPE
        manifest = {"_type": STATEMENT_TYPE, "subject": subject, "predicateType": ptype, "predicate": predicate}
        envelope = sign_statement(manifest, private_key)
        man_tmp = temp_json(out.parent, manifest_path(out).name, envelope)

        report = report_path(out, run.folder)
        private_folder(run.folder)
        report.parent.mkdir(exist_ok=True)
        rep_tmp = temp_json(report.parent, report.name, memo)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(rep_tmp, report)
    _public_mtimes((tmp, man_tmp), statement["predicate"].get("started_at"))
    os.replace(tmp, out)
    os.replace(man_tmp, manifest_path(out))  # the manifest last: no manifest over a half-written file
    return SynthResult(
        out=out,
        manifest=manifest_path(out),
        report=report,
        rows=rows,
        differentially_private=private,
        guarantee=guarantee,
        memorisation=memo,
    )
