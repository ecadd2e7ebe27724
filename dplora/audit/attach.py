"""``dplora audit --attach RUN_DIR``: the audit's results as an ``audit`` section of a release record, re-signed.

Design (README "Attaching an audit to a release"):

- The release must verify under the public half of the signing key that re-signs it, be differentially private
  and carry no audit section yet (one audit per release: attaching a second would let a better-looking audit
  replace a worse one).
- The audit must run the release's mechanism: the same accountant, q, σ, T, C, protected unit, adjacency, δ,
  sampler and unit clipping. q = B/N, so the audit declares the release's N (``privacy.num_units``) when its
  contract declares none (a release's N is public: declared, or counted under replace-one); more units in the
  audit's data plus its canaries than that N is a local warning only, as in training. The plan is compared
  before training (exit 2 with the first mismatch, nothing written to the release) and again from the finished
  audit's report.
- A non-private baseline (``privacy.enabled: false``) is never attached: its numbers never go into a signed record.
- The section holds the audit's numbers, the data it trained on and its ledger charge, the sha256 of
  ``audit.json``, the dplora version and the UTC date. The record is the release's predicate plus that section,
  signed again by :func:`dplora.release.envelope.write_release` with the same artifacts; the envelope and bundle are
  replaced so that the old record stays valid until the new one is in place (see there).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

from dplora import atomic
from dplora.contract.spec import PrivacySection
from dplora.data.digest import sha256_file
from dplora.errors import BadInputError, DploraError
from dplora.release.audit_section import composed_attack_ceiling, composed_runs, first_mismatch, record_mechanism

SECTION = "audit"
DATA_NOTES = {
    "private": "the contract's private training data plus the canaries",
    "public": "a file declared public, plus the canaries",
    "surrogate": "surrogate data (e.g. the dplora demo-data generator), plus the canaries",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttachTarget:
    """A verified release ready to take an audit: its folder, signed statement and the key that re-signs it."""

    folder: Path
    statement: dict
    private_key: object

    @property
    def record(self) -> dict:
        """The release record (the statement's predicate)."""
        return self.statement["predicate"]


def open_release(run_dir: Path, signing_key: Path | None) -> AttachTarget:
    """Load the signing key and verify ``run_dir`` under its public half; refuse what cannot take an audit.

    Args:
        run_dir: the release folder (holding ``release.dsse.json``).
        signing_key: the Ed25519 private key that signed the release (else ``$DPLORA_SIGNING_KEY``).
    Returns:
        :class:`AttachTarget`.
    Raises:
        BadInputError: no key, a release that does not verify under it, a non-private record, or a record that
            already has an audit section (exit 2).
    """
    from dplora.release.envelope import RELEASE_FILENAME
    from dplora.release.keys import load_private_key
    from dplora.release.verify import verify_release

    run_dir = Path(run_dir)
    if not (run_dir / RELEASE_FILENAME).is_file():
        raise BadInputError(f"--attach {run_dir}: no {RELEASE_FILENAME} there (give a release folder)")
    private_key = load_private_key(signing_key)
    try:
        verified = verify_release(run_dir, private_key.public_key())
    except DploraError as err:
        raise BadInputError(f"--attach {run_dir}: the release does not verify under the signing key: {err}") from None
    if not verified.differentially_private:
        raise BadInputError(f"--attach {run_dir}: a non-private control record takes no audit")
    if SECTION in verified.statement["predicate"]:
        raise BadInputError(f"--attach {run_dir}: the record already has an audit section (one audit per release)")
    return AttachTarget(folder=run_dir, statement=verified.statement, private_key=private_key)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MovedFiles:
    """Where a moved release's data and base model are, for the audit's contract: ``data.path=`` / ``model.path=``
    overrides, and the data file's name as trained (the name the audit section records, never a given file's)."""

    overrides: list[str]
    data_name: str | None = None


def moved_release_files(contract, target: AttachTarget, inputs, log=print) -> MovedFiles:
    """The audit contract's data and base model found where the release now is
    (:func:`dplora.release.locate.locate_inputs`), when the audit reads the release's own files.

    A file is located when ``--data`` / ``--model`` is given, or when the audit contract names the release's file by
    the same path (its ``contract.yaml`` as trained): from here, else from the run folder's parent. Another data
    file (a public or surrogate audit) is left as the contract names it.

    Args:
        contract: the audit's contract before the overrides (its ``data.path`` and ``model.path`` as written).
        target: the release the audit attaches to (:func:`open_release`: already verified).
        inputs: :class:`dplora.release.locate.ReleaseInputs` (``--data``, ``--model``, ``--data-key``).
        log: the one-line sink of notes.
    Returns:
        :class:`MovedFiles` (absolute paths, so a path reads the same as a YAML override value).
    Raises:
        BadInputError: a needed file not found (naming the option), or a file whose digest differs from the
            release record's (exit 2).
    """
    from dplora.release.locate import locate_inputs
    from dplora.release.read import read_run

    run = read_run(target.folder)
    data = inputs.data is not None or contract.data.path == run.contract.data.path
    model = inputs.model is not None or (
        contract.model.path is not None and contract.model.path == run.contract.model.path
    )
    located = locate_inputs(run, inputs, data=data, model=model, log=log)
    overrides = [f"data.path={Path(located.contract.data.path).resolve()}"] if data else []
    if model and located.contract.model.path is not None:
        overrides.append(f"model.path={Path(located.contract.model.path).resolve()}")
    return MovedFiles(overrides=overrides, data_name=Path(run.contract.data.path).name if data else None)


def pin_overrides(privacy: PrivacySection, target: AttachTarget) -> list[str]:
    """Overrides that give the audit the release's N (so q, T and σ follow), when its contract's privacy section
    declares none.

    Raises:
        BadInputError: a non-private baseline (never attached).
    """
    from dplora.plan.resolve import is_control

    if is_control(privacy):
        raise BadInputError(
            "--attach: a privacy.enabled=false baseline is never attached: its numbers never go into a signed record"
        )
    if privacy.num_units is not None:
        return []
    return [f"privacy.num_units={int(target.record['accounting']['num_units'])}"]


def mechanism_of(plan, privacy: PrivacySection) -> dict:
    """The mechanism an attached audit must share with the release, from a plan and its contract's privacy
    section."""
    from dplora.release.record import unit_guarantee

    unit = unit_guarantee(privacy)
    return {
        "accountant": plan.accountant.value,
        "sample_rate": plan.sample_rate,
        "noise_multiplier": plan.noise_multiplier,
        "steps": plan.steps,
        "max_grad_norm": plan.max_grad_norm,
        "protected_unit": plan.protected_unit.value,
        "adjacency": plan.adjacency.value,
        "delta": plan.delta,
        "sampler": unit["sampler"],
        "clipping": unit["clipping"],
    }


def check_plan(contract, target: AttachTarget) -> None:
    """Refuse (exit 2) an audit whose plan is not the release's mechanism; computed before training.

    The contract must declare N (see :func:`pin_overrides`), so the plan needs no data.

    Raises:
        BadInputError: the first differing field; PlanRefusedError from planning.
    """
    from dplora.plan.training import make_plan

    plan = make_plan(contract, num_units=contract.privacy.num_units, num_units_source="contract")
    _refuse_mismatch(mechanism_of(plan, contract.privacy), target)


def _refuse_mismatch(mechanism: dict, target: AttachTarget) -> None:
    if (what := first_mismatch(mechanism, record_mechanism(target.record))) is not None:
        raise BadInputError(
            f"--attach {target.folder}: the audit does not run the release's mechanism ({what}); "
            "use the release's contract settings"
        )


def audit_section(report: dict, report_sha256: str, data_files: list[str]) -> dict:
    """The record's ``audit`` section from a finished audit's report (JSON-ready; no secrets, no scores)."""
    import dplora

    keys = (
        "epsilon_lower_bound",
        "claimed_epsilon",
        "delta",
        "confidence",
        "violation",
        "verdict",
        "bound_violation",
        "epsilon_lower_bound_ceiling",
        "epsilon_lower_bound_ceiling_delta0",
        "informative",
        "uninformative_reasons",
        "ceiling_exceeded",
        "tpr_vs_ceiling",
        "power_check",
        "canaries",
        "inserted",
        "records_per_canary",
        "guesses_in",
        "guesses_out",
        "guesses",
        "correct",
        "mia_auc",
        "candidates",
        "exposure_inserted_mean",
        "exposure_held_out_mean",
        "exposure_chance_bits",
        "exposure_max_bits",
        "steps",
    )
    source = report["data_source"]
    return {
        "method": report["audit"],
        **{k: report[k] for k in keys if k in report},
        "mechanism": report["mechanism"],
        "data": {"source": source, "files": data_files, "note": DATA_NOTES[source]},
        "ledger": report["ledger"],
        "audit_run_id": report["run_id"],
        "report": {"file": "audit.json", "sha256": report_sha256},
        "dplora_version": dplora.__version__,
        # the date only: the attach's time minus the release's start would time the private runs
        "attached_on": dt.datetime.now(dt.timezone.utc).date().isoformat(),
    }


def attach(target: AttachTarget, section: dict) -> Path:
    """Re-sign the release's record with ``section`` added, keeping the old record valid until it is replaced.

    Checks again, just before writing, that the release still verifies and is unchanged since
    :func:`open_release`, and that the finished audit ran the release's mechanism.

    Returns:
        The envelope path.
    Raises:
        BadInputError: the release changed meanwhile, the audit's mechanism differs (nothing is written), or
            the files could not be written (the old ones are restored; see ``write_release``).
    """
    from dplora.contract.loader import load_contract
    from dplora.release import report
    from dplora.release.verify import verify_release

    _refuse_mismatch(section["mechanism"], target)
    try:
        now = verify_release(target.folder, target.private_key.public_key())
    except DploraError as err:
        raise BadInputError(f"--attach {target.folder}: the release no longer verifies: {err}") from None
    if now.statement != target.statement:
        raise BadInputError(f"--attach {target.folder}: the release changed during the audit; nothing was attached")
    composed = composed_claim(target.record, section)
    if composed is not None:
        section = {**section, "composed": composed}
    record = report.extend(target.record, **{SECTION: section})
    card = target.folder / "adapter" / "README.md"
    old_card = card.read_bytes() if card.is_file() else None
    data = load_contract(Path(target.folder) / "contract.yaml").data
    report.rewrite_card(target.folder, record, data)  # the card states the composed claim too; re-signed below
    # subject names are relative to the release folder, and write_release resolves them against it: joined to a
    # relative --attach folder they would be resolved twice ("artifact run/adapter/README.md is missing")
    artifacts = [Path(s["name"]) for s in target.statement["subject"]]
    try:
        return report.sign_as_is(target.folder, record, artifacts, private_key=target.private_key)
    except BaseException as err:
        if old_card is not None:  # the old record signs the old card: put it back
            atomic.write_bytes(card, old_card)
        if not isinstance(err, OSError):
            raise
        raise BadInputError(
            f"--attach {target.folder}: cannot write the record ({err.strerror or err}); the old record is kept"
        ) from None


COMPOSITION_RULE = (
    "the release and an audit run on the same private units are two DP releases about the same people, published "
    "together in this record: the claim is their composition (dplora.accounting.composition.compose: basic "
    "composition, Dwork & Roth 2014 Thm 3.16, or the accountant's own, whichever is smaller)"
)


def composed_claim(record: dict, section: dict) -> dict | None:
    """The (ε, δ) that a release with an attached audit on its private data claims: the composition of both runs.

    An audit on ``private`` data is a second DP run on the release's units, and its outputs (bound, counts, AUC,
    exposure) sit in the signed record, so the record as a whole is only as private as the two runs composed. An
    audit on public or surrogate data touches no private unit: None (the release's ε stands alone). So is a
    non-private audit run (it could not be attached: the mechanism must match).

    Args:
        record: the release record (its ``accounting``: ε spent, δ, q, σ, T, accountant; ``privacy.adjacency``).
        section: the audit section (:func:`audit_section`): ``data.source``, ``mechanism``, ``ledger``.
    Returns:
        ``{"total_epsilon", "total_delta", "composition", "compositions", "rule", "runs", "attack_ceiling"}`` or
        None; ``attack_ceiling`` is the two runs' ceiling together (:func:`composed_attack_ceiling`).
    """
    from dplora.accounting.composition import compose

    runs = composed_runs(record, section)
    if runs is None:
        return None
    adjacency = record["privacy"]["adjacency"]
    total = compose(runs, adjacency)
    return {**total, "rule": COMPOSITION_RULE, "runs": runs, "attack_ceiling": composed_attack_ceiling(runs, adjacency)}


def record_in_ledger(target: AttachTarget, envelope: Path, ledger_path: Path | None, log) -> None:
    """List the re-signed record beside the old one in the ledger (post-processing, no new charge), if it can.

    A release on a population was recorded there by its sha256; the re-signed record has a new one. Nothing to do
    without a population; a ledger without the release's charge gets a warning (the attach itself stands).
    """
    from dplora.ledger.store import Ledger, default_ledger_path

    record = target.record
    if not record.get("population"):
        return
    acc = record["accounting"]
    try:
        with Ledger(ledger_path or default_ledger_path(), create=False) as ledger:
            ledger.record_release(
                run_id=record["run_id"],
                record_sha256=sha256_file(envelope),
                epsilon=acc["epsilon_spent"],
                delta=acc["delta"],
                label="audit attached",
            )
    except DploraError as err:
        log(f"warning: the re-signed record is not listed in the ledger: {err}")


def summary_line(section: dict) -> str:
    """One line for ``dplora verify``: the bound against the claim, the counts, AUC, exposure, data and ledger."""

    def num(x, fmt=".3f"):
        return "n/a" if x is None else x if isinstance(x, str) else format(x, fmt)

    verdict = "VIOLATION (the bound exceeds the claimed ε)" if section.get("violation") else "no violation"
    if section.get("violation"):
        if section.get("ceiling_exceeded") and not section.get("bound_violation"):
            verdict = "VIOLATION (a measured TPR exceeds the release's attack ceiling)"
        elif section.get("ceiling_exceeded"):
            verdict = "VIOLATION (the bound exceeds the claimed ε; a measured TPR exceeds the attack ceiling)"
    elif section.get("verdict") == "uninformative":
        verdict = "uninformative, not a pass (" + "; ".join(section.get("uninformative_reasons") or []) + ")"
    elif "verdict" not in section and isinstance(section.get("canaries"), int):
        from dplora.audit.power import MIN_INFORMATIVE_CANARIES

        if section["canaries"] < MIN_INFORMATIVE_CANARIES:  # a section attached before verdicts existed
            verdict = (
                f"uninformative, not a pass ({section['canaries']} canaries < {MIN_INFORMATIVE_CANARIES}; "
                "attached before audits stated their power)"
            )
    if section.get("epsilon_lower_bound_ceiling") is not None:
        verdict += f"; this audit could show at most ε̂ {num(section['epsilon_lower_bound_ceiling'])}"
    ledger = section.get("ledger") or {}
    charge = (
        f"charged ε={num(ledger.get('epsilon'), '.4f')} "
        + (f"to {ledger['population']!r}" if ledger.get("population") else "as an unassigned run")
        if ledger.get("charged")
        else "not charged to a ledger"
    )
    data = section.get("data") or {}
    return (
        f"audit: ε lower bound {num(section.get('epsilon_lower_bound'))} ({num(section.get('confidence'), '.0%')}) "
        f"vs claimed ε {num(section.get('claimed_epsilon'), '.4f')}: {verdict}; {section.get('canaries')} canaries "
        f"({section.get('inserted')} inserted), {section.get('correct')}/{section.get('guesses')} guesses correct; "
        f"MIA AUC {num(section.get('mia_auc'))}; exposure {num(section.get('exposure_inserted_mean'), '.2f')} bits "
        f"(held out {num(section.get('exposure_held_out_mean'), '.2f')}); data: {data.get('source')}; {charge}; "
        f"attached {section.get('attached_on') or section.get('attached_at')}"
    )


def composed_line(record: dict) -> str | None:
    """One line for ``dplora verify``: the composed claim of a release and its attached private-data audit."""
    composed = ((record or {}).get(SECTION) or {}).get("composed")
    if not isinstance(composed, dict):
        return None
    return (
        f"claim with the attached audit on the private data (two DP runs on the same units): total "
        f"ε={composed['total_epsilon']:.4f}, δ={composed['total_delta']:g} ({composed['composition']})"
    )
