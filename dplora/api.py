"""dplora from Python: plan, train and verify with every guarantee of the CLI, for a notebook or an orchestrator.

``import dplora`` gives :func:`budget`, :func:`train`, :func:`verify` and :func:`private_report` (this module), and
the error classes of :mod:`dplora.errors`, which map one-to-one onto the CLI's exit codes (``err.exit_code``).
Each function takes a contract as a path, a YAML string, a mapping or a :class:`dplora.contract.spec.Contract`,
with dotted overrides as on the command line (``["training.lr=1e-3"]``).

Public by default, like the CLI under CI: :func:`train` returns a :class:`Release` of public fields only (the plan,
ε, δ, the release path, the run id, the attack ceiling), prints nothing unless asked, and charges the ledger exactly
as ``dplora train`` does (it runs the same code: the CLI's ``train`` calls :func:`load` and :func:`run`). The
private diagnostics (realised batches, timings, held-out numbers on private data) are read only through
:func:`private_report`, whose name, return type and docstring say they are NOT covered by DP. Errors carry the
CLI's one-line message (never record text or a private count), raised from None.

Modelled on the library-first surfaces of the field: Opacus's ``PrivacyEngine`` and TRL's trainers are Python
objects first; JetBrains' DPTrainer runs DP inside the Hugging Face ``Trainer``.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dplora.contract.spec import Contract
from dplora.errors import BadInputError, DploraError
from dplora.recipe.config import RunOptions, RunResult
from dplora.surface import PrivateLog

ContractSource = str | os.PathLike | Mapping | Contract
"""A contract: a YAML file's path, the YAML text itself, a mapping of its sections, or a validated Contract."""


def load(contract: ContractSource, overrides: Sequence[str] = ()) -> Contract:
    """The validated contract from ``contract`` with ``overrides`` applied (``KEY=VALUE``, dotted keys).

    A string holding a newline is read as YAML text; any other string or path is a file (so a missing file gets
    the CLI's "contract file not found", also when its name holds a ``:``). The same loader, bounds and messages
    as ``dplora train CONFIG KEY=VALUE …``.

    Args:
        contract: a path, YAML text, a mapping (``{"privacy": {...}, "model": {...}, ...}``) or a Contract.
        overrides: ``section.key=value`` strings.
    Returns:
        :class:`dplora.contract.spec.Contract` (frozen).
    Raises:
        BadInputError: not a contract (wrong type, missing file, bad YAML, unknown key, bad value): exit code 2.
    Source: :func:`dplora.contract.loader.load_contract`.
    """
    from dplora.contract.loader import apply_overrides, load_contract, load_contract_bytes, parse_contract
    from dplora.contract.shape import resolve_auto

    overrides = list(overrides)
    if isinstance(contract, Contract):
        if not overrides:
            return contract
        contract = contract.model_dump(mode="json")
    if isinstance(contract, Mapping):
        try:  # plain values only, as YAML would give
            raw = json.loads(json.dumps(dict(contract), default=str))
        except (TypeError, ValueError):  # a non-text key, a mapping that holds itself
            raise BadInputError(
                "contract: a mapping of plain values (text keys; text, numbers, booleans, lists and mappings)"
            ) from None
        return resolve_auto(parse_contract(apply_overrides(raw, overrides) if overrides else raw))
    if isinstance(contract, str) and "\n" in contract:
        return load_contract_bytes(contract, overrides)
    if isinstance(contract, str | os.PathLike):
        return load_contract(Path(contract), overrides)
    raise BadInputError(
        f"contract: a path, YAML text, a mapping or a Contract, not {type(contract).__name__}"
    ) from None


def budget(
    contract: ContractSource,
    overrides: Sequence[str] = (),
    *,
    ledger: str | os.PathLike | None = None,
    recommend: bool = False,
    epochs: float | None = None,
    max_steps: int | None = None,
) -> dict:
    """The dry run of ``dplora budget --json``: N, q, T, σ and ε, the attack ceiling, the ledger's room.

    Public, as the CLI's report under CI: no records-per-unit statistics and no data-count warnings, and a counted
    N where N is private (undeclared under add/remove) is refused (declare ``privacy.num_units``).

    Args:
        contract, overrides: see :func:`load`.
        ledger: the budget ledger (else ``$DPLORA_LEDGER`` or the user data dir) for a population's room.
        recommend, epochs, max_steps: let the planner choose B, T and lr (``--recommend``; public inputs only).
    Returns:
        The report as a dict (``num_units``, ``sample_rate``, ``steps``, ``noise_multiplier``, ``epsilon``,
        ``delta``, ``accountant``, ``attack_ceiling``, ...), without ``not_covered_by_dp``.
    Raises:
        BadInputError, PlanRefusedError: as ``dplora budget`` (exit code 2).
    Source: :func:`dplora.tuning.budget.budget_report`.
    """
    from dplora.tuning.budget import budget_report

    try:
        report = budget_report(
            load(contract, overrides),
            [],
            ledger_path=Path(ledger) if ledger is not None else None,
            recommend=recommend,
            epochs=epochs,
            max_steps=max_steps,
            show_private=False,
            log=lambda _line: None,
        )
    except DploraError as err:
        raise err from None
    report.pop("not_covered_by_dp", None)
    return report


@dataclasses.dataclass(frozen=True)
class Release:
    """A finished run's public facts: the fields of ``dplora train --json`` and the record's attack ceiling.

    Nothing here is computed from the private data except through DP outputs (ε spent is the plan's curve at the
    steps taken). Realised batches, timings and held-out numbers on private data are not here: see
    :func:`private_report`.

    Attributes:
        run_id: 32 hex characters (random). path: the release folder (``adapter/``, ``release.dsse.json``).
        differentially_private: False for a ``privacy.enabled: false`` control (no guarantee).
        epsilon, delta: ε spent at the steps taken (the plan's curve at integer T) and δ.
        target_epsilon, accountant: the contract's target and the accountant (rdp, prv or pld).
        steps, num_units, sample_rate, noise_multiplier, max_grad_norm: T, N (public), q, σ, C.
        attack_ceiling: the record's bound on a membership test, true-positive rate at each false-positive rate
            (``{"1%": 0.036, ...}``), or None for a control.
        summary: the whole ``train --json`` document.
    """

    run_id: str
    path: Path
    differentially_private: bool
    epsilon: float
    delta: float
    target_epsilon: float
    accountant: str
    steps: int
    num_units: int
    sample_rate: float
    noise_multiplier: float
    max_grad_norm: float
    attack_ceiling: Mapping | None
    summary: Mapping = dataclasses.field(repr=False)

    @classmethod
    def of(cls, result: RunResult) -> Release:
        """The public part of a finished run's result (its ``train --json`` summary and signed record)."""
        summary = dict(result.summary or {})
        folder = Path(result.output_dir).absolute()
        predicate = _predicate(folder)
        ceiling = predicate.get("attack_ceiling") if isinstance(predicate.get("attack_ceiling"), dict) else None
        return cls(
            run_id=summary["run_id"],
            path=folder,
            differentially_private=summary["differentially_private"],
            epsilon=summary["epsilon_spent"],
            delta=summary["delta"],
            target_epsilon=summary["target_epsilon"],
            accountant=summary["accountant"],
            steps=summary["steps"],
            num_units=summary["num_units"],
            sample_rate=summary["sample_rate"],
            noise_multiplier=summary["noise_multiplier"],
            max_grad_norm=summary["max_grad_norm"],
            attack_ceiling=(ceiling or {}).get("true_positive_rate_at"),
            summary=summary,
        )


def _predicate(folder: Path) -> dict:
    """The signed record of the release in ``folder`` (decoded; the signature is checked by :func:`verify`)."""
    from dplora.release.envelope import RELEASE_FILENAME

    envelope = json.loads((folder / RELEASE_FILENAME).read_text())
    return json.loads(base64.b64decode(envelope["payload"])).get("predicate", {})


def run(contract: Contract, options: RunOptions, *, log=None, private_log: PrivateLog | None = None) -> RunResult:
    """Run ``contract`` as ``dplora train`` does (the CLI's ``train`` calls this): the admission, the recipe, the
    release and the ledger charge. Returns the internal :class:`dplora.recipe.config.RunResult`, which holds private
    diagnostics: the CLI prints them only where private output may go; :func:`train` returns a :class:`Release`.

    Raises:
        BadInputError, PlanRefusedError, TrainingFailedError: as :func:`dplora.recipe.train.run_training`.
        KeyboardInterrupt: SIGINT/SIGTERM (a resume checkpoint is written first).
    """
    from dplora.recipe.train import run_training

    return run_training(contract, options, log=log if log is not None else _silent, private_log=private_log)


def train(
    contract: ContractSource,
    overrides: Sequence[str] = (),
    *,
    signing_key: str | os.PathLike | None = None,
    data_key: str | os.PathLike | None = None,
    ledger: str | os.PathLike | None = None,
    overwrite: bool = False,
    resume: bool = False,
    threads: int | None = None,
    on_line: Callable[[str], None] | None = None,
    on_progress: Callable[[int, int, float], None] | None = None,
    show_private: bool = False,
) -> Release:
    """Train DP-LoRA adapters under ``contract`` and write them with a signed release, as ``dplora train``.

    Args:
        contract, overrides: see :func:`load`.
        signing_key: Ed25519 private key PEM (else ``$DPLORA_SIGNING_KEY``).
        data_key: the data owner's HMAC key file for the keyed data digest (else ``$DPLORA_DATA_KEY``; else none).
        ledger: the budget ledger (else ``$DPLORA_LEDGER`` or the user data dir); the run is charged in it.
        overwrite, resume: as ``--overwrite`` and ``--resume``.
        threads: CPU threads (else the contract's or the cores free now).
        on_line: receives the run's public lines (the plan, the device, the estimate, warnings); None: silent.
        on_progress: called after every logical step with public values only: ``(step, T, planned ε after it)``.
        show_private: also print the private diagnostics (NOT covered by DP) on stderr, for a private terminal.
    Returns:
        :class:`Release` (public fields only).
    Raises:
        BadInputError, PlanRefusedError: before anything is written (exit code 2).
        TrainingFailedError: training failed; no release, FAILED.json and the resume checkpoint stay (exit code 4).
        KeyboardInterrupt: interrupted; a resume checkpoint was written (``resume=True`` continues).
    Source: :func:`dplora.recipe.train.run_training` (the CLI's code path).
    """
    resolved = load(contract, overrides)
    options = RunOptions(
        signing_key=_path(signing_key),
        data_key=_path(data_key),
        ledger_path=_path(ledger),
        overwrite=overwrite,
        resume=resume,
        threads=threads,
        progress=False,  # no bar or lines on stderr: on_progress gets the public values
        on_progress=on_progress,
        contract_path=_contract_file(contract),  # the output folder must not hold it, as in the CLI
    )
    echo = (lambda line: print(line, file=sys.stderr)) if show_private else None
    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught:  # nothing printed unless asked: dplora's own
            warnings.simplefilter("always")  # warnings (a group-readable key) go to on_line, others are dropped
            result = run(resolved, options, log=on_line, private_log=PrivateLog(echo))
    except DploraError as err:
        raise err from None
    finally:
        for w in caught:
            if on_line is not None and f"{os.sep}dplora{os.sep}" in str(w.filename):
                on_line(f"warning: {w.message}")
    return Release.of(result)


@dataclasses.dataclass(frozen=True)
class Verification:
    """What :func:`verify` checked and what the signed record claims.

    Attributes:
        ok: the signature, every file's sha256 and the recomputed attack ceiling all check out.
        differentially_private: False for a control's record (no guarantee).
        key_id_rule: which key id rule the signature matched (securesystemslib's, or an older raw-key rule).
        claims: the record's public claims: run id, ε spent, δ, accountant, protected unit, adjacency, N, q, σ, T.
        audit: an attached audit section (``dplora audit --attach``), or None.
    """

    ok: bool
    differentially_private: bool
    key_id_rule: str
    claims: Mapping
    audit: Mapping | None = None


def verify(
    run_dir: str | os.PathLike,
    *,
    public_key: str | os.PathLike,
    data: Sequence[str | os.PathLike] = (),
    data_key: str | os.PathLike | None = None,
    base_model: str | os.PathLike | None = None,
) -> Verification:
    """Check a release as ``dplora verify`` does: the DSSE signature, every file, the attack ceiling, and with
    ``data`` and ``data_key`` the keyed data digest, with ``base_model`` the base model's files.

    Raises:
        VerificationError: a check failed (exit code 3). BadInputError: a file or key cannot be read (exit 2).
    Source: :func:`dplora.release.verify.verify_release`.
    """
    from dplora.release.envelope import load_data_key
    from dplora.release.verify import verify_release

    if data_key is not None and not data:
        raise BadInputError("data_key needs data: the data file(s) whose keyed digest to check")
    try:
        key = load_data_key(_path(data_key)) if data else None  # None: $DPLORA_DATA_KEY, as the CLI
        result = verify_release(
            Path(run_dir),
            Path(public_key),
            data_files=[Path(p) for p in data] or None,
            data_key=key,
            base_model=_path(base_model),
        )
    except DploraError as err:
        raise err from None
    predicate = result.statement.get("predicate", {})
    accounting, mechanism = predicate.get("accounting", {}), predicate.get("mechanism", {})
    privacy = predicate.get("privacy", {})
    claims = {
        "run_id": predicate.get("run_id"),
        "epsilon": accounting.get("epsilon_spent"),
        "delta": accounting.get("delta"),
        "accountant": accounting.get("accountant"),
        "protected_unit": privacy.get("protected_unit"),
        "adjacency": privacy.get("adjacency"),
        "num_units": accounting.get("num_units"),
        "sample_rate": accounting.get("sample_rate"),
        "noise_multiplier": accounting.get("noise_multiplier"),
        "steps": accounting.get("steps_done"),
        "max_grad_norm": mechanism.get("max_grad_norm"),
    }
    return Verification(
        ok=True,
        differentially_private=result.differentially_private,
        key_id_rule=result.key_id_rule.value,
        claims=claims,
        audit=result.audit,
    )


@dataclasses.dataclass(frozen=True)
class NotCoveredByDP:
    """A run's private diagnostics: computed on the private data and NOT covered by DP. Keep them local; never
    publish them, paste them into a shared notebook, log them to a tracker or attach them to a release.

    Attributes:
        values: ``<output_dir>.private/report.json`` (realised empty steps, step times, peak memory, ...).
        folder: ``<output_dir>.private/``, where ``train.log`` and ``metrics.jsonl`` also are.
    """

    values: Mapping = dataclasses.field(repr=False)
    folder: Path

    def __repr__(self) -> str:
        return f"NotCoveredByDP(folder={str(self.folder)!r}, values=<{len(self.values)} private values, not shown>)"


def private_report(release: Release | str | os.PathLike) -> NotCoveredByDP:
    """The private diagnostics of a finished run (NOT covered by DP): read explicitly, never returned by
    :func:`train`.

    ``values`` holds ``<run>.private/report.json`` (timings, empty steps, peak memory, records zeroed) and, when the
    ``eval``: the held-out numbers training wrote to ``metrics.jsonl`` (base and adapter loss per target token and
    perplexity, per-group numbers, a classification's accuracy and recall, as ``dplora eval --json`` reports them),
    or None when the run evaluated none.

    Raises:
        BadInputError: the run has no private report (not a finished dplora run folder).
    """
    from dplora.run.outputs import private_path

    folder = private_path(release.path if isinstance(release, Release) else Path(release))
    try:
        values = json.loads((folder / "report.json").read_text())
    except (OSError, ValueError):
        raise BadInputError(f"no private report in {folder}: not a finished dplora run") from None
    # "eval" is always a key (None: no held-out numbers), so the repr's count of values never says whether a
    # private held-out split could be evaluated
    return NotCoveredByDP(values=values | {"eval": _held_out_numbers(folder / "metrics.jsonl")}, folder=folder)


def _held_out_numbers(metrics: Path) -> dict | None:
    """The last ``not_covered_by_dp.eval`` entry of a run's private ``metrics.jsonl`` (None: no evaluation)."""
    found = None
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        private = entry.get("not_covered_by_dp") if isinstance(entry, dict) else None
        if isinstance(private, dict) and isinstance(private.get("eval"), dict):
            found = private["eval"]
    return found


def _contract_file(contract: ContractSource) -> Path | None:
    """The contract's file when ``contract`` names one (a path, or a string without a newline), else None."""
    if isinstance(contract, os.PathLike) or (isinstance(contract, str) and "\n" not in contract):
        return Path(contract)
    return None


def _path(value) -> Path | None:
    return None if value is None else Path(value)


def _silent(_line: str) -> None:
    """The public log of an API call that asked for none (nothing is printed to a notebook cell unless asked)."""
