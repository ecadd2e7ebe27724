"""What a caller chooses about one training run besides the contract: keys, ledger policy, output policy,
threads and reporting (issue 44: one frozen, typed carrier instead of the CLI's dict and keyword lists)."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    """The options of :func:`dplora.recipe.train.run_training`; none of them changes the DP mechanism.

    Attributes:
        signing_key: Ed25519 private key PEM (else ``$DPLORA_SIGNING_KEY``).
        data_key: the data owner's HMAC key file (else ``$DPLORA_DATA_KEY``; else no keyed data digest).
        ledger_path: SQLite budget ledger (else ``$DPLORA_LEDGER`` or the user data dir).
        overwrite: replace a previous dplora run's output folder (only after the new run succeeded).
        resume: continue from the resume checkpoint in ``<output_dir>.partial`` (same contract and data).
        threads: CPU threads (None: the cores free now).
        progress: report progress on stderr (a bar on a terminal, plain lines otherwise).
        tuning_trial: charge the ledger as a hyperparameter-tuning trial (it counts like any release).
        non_private: allow a ``privacy.enabled: false`` control on a ledger population (charged ε = ∞).
        contract_path: the contract file, which the output folder must not hold.
        ledger_release: record the signed release in the ledger (False: a ``dplora sweep`` trial, signed with a
            throw-away key; the charge is the same).
        extra_records: rows appended to the training table after the held-out split (the audit's canaries, each
            its own protected unit); every column of the data file, text values.
    """

    signing_key: Path | None = None
    data_key: Path | None = None
    ledger_path: Path | None = None
    overwrite: bool = False
    resume: bool = False
    threads: int | None = None
    progress: bool = True
    tuning_trial: bool = False
    non_private: bool = False
    contract_path: Path | None = None
    ledger_release: bool = True
    extra_records: tuple[dict, ...] = ()
