"""Named errors of dplora, each carrying the documented process exit code.

| exit code | error class            | meaning                                        |
|-----------|------------------------|------------------------------------------------|
| 2         | ``BadInputError``      | bad input (contract, data, model path, keys)   |
| 2         | ``PlanRefusedError``   | a plan that cannot meet its contract or a cap  |
| 3         | ``VerificationError``  | ``dplora verify`` found a mismatch             |
| 4         | ``TrainingFailedError``| a sanity check or a non-finite loss in training |
| 4         | ``UncoveredParameterError`` | a trainable tensor no per-example path covers |
| 6         | ``NotPrivateError``    | a non-private run, used without ``--allow-non-private`` |

Messages are one line and never contain raw training text.
"""

from __future__ import annotations


class DploraError(Exception):
    """Base class: a one-line, user-facing message plus an exit code."""

    exit_code: int = 1


class BadInputError(DploraError):
    """The contract, a data file, a model path or a key is invalid (exit code 2)."""

    exit_code = 2


class PlanRefusedError(DploraError):
    """The plan cannot meet the contract: target ε unreachable, cap exceeded (exit code 2)."""

    exit_code = 2


class UnsupportedAccountingError(PlanRefusedError):
    """The chosen accountant cannot account this mechanism (e.g. RDP with replace-one)."""


class VerificationError(DploraError):
    """A release record's signature or a digest does not match (exit code 3)."""

    exit_code = 3


class TrainingFailedError(DploraError):
    """Training stopped: a sanity check failed or the loss became non-finite (exit code 4)."""

    exit_code = 4


class UncoveredParameterError(TrainingFailedError):
    """A trainable tensor that the chosen per-example gradient path does not cover (exit code 4)."""


class NotPrivateError(DploraError):
    """The run is a non-private control (no DP guarantee) and ``--allow-non-private`` was not given (exit code 6)."""

    exit_code = 6
