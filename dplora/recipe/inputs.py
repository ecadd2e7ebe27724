"""The inputs of a run that its output folder must not hold (contract, data, model, keys, ledger).

It names the release's key variables and the ledger's default path, so it sits above the release and ledger
stages; :func:`dplora.run.outputs.check_output_dir` takes its list.
"""

from __future__ import annotations

import os
from pathlib import Path

from dplora.ledger.store import default_ledger_path
from dplora.release.envelope import DATA_KEY_ENV
from dplora.release.keys import SIGNING_KEY_ENV


def protected_inputs(contract, *, contract_path, signing_key, data_key, ledger_path) -> list[tuple[str, Path]]:
    """The run's inputs that its output folder must not hold: contract, data, model, keys, ledger.

    Keys and the ledger given through the environment (``$DPLORA_SIGNING_KEY``, ``$DPLORA_DATA_KEY``,
    ``$DPLORA_LEDGER`` or the default ledger path) are included.
    """
    signing = signing_key or os.environ.get(SIGNING_KEY_ENV, "").strip() or None
    data_k = data_key or os.environ.get(DATA_KEY_ENV, "").strip() or None
    items = [
        ("the contract", contract_path),
        ("the data file", contract.data.path),
        ("the model", contract.model.path),
        ("the signing key", signing),
        ("the public key", Path(signing).with_suffix(".pub") if signing else None),
        ("the data key", data_k),
        ("the ledger", ledger_path or default_ledger_path()),
    ]
    return [(what, Path(p)) for what, p in items if p]
