"""Public samples for measurements that must not read private data: a file the user declares public, or demo tickets.

``dplora clip-guide`` and the selection step of ``dplora sweep`` measure on data that is public by construction:
either a file the user names with ``--public`` / ``--eval-public`` (the user declares it public; dplora cannot
check that) or rows made by the demo generator (:mod:`dplora.data.demo`, fake tickets), mapped onto the contract's
columns: prompt/response ← message/reply, a text column ← ``message\\nreply``, a messages column ← the conversation
(user: message, assistant: reply), the unit key ← ``ticket_id``
(ticket level) or ``customer_id`` (user level). The contract's own training file is refused: measuring it would be
a query on private data that no accountant charges.
"""

from __future__ import annotations

from pathlib import Path

from dplora.contract.choices import ProtectedUnit
from dplora.contract.spec import DataSection, PrivacySection
from dplora.data.demo import generate_tickets
from dplora.errors import BadInputError, excerpt

DEMO_SEED = 16_016  # the demo generator's seed for public samples: not 0, the seed of `dplora demo-data`
DEMO_SOURCE = "demo generator (dplora/data/demo.py, fake tickets, seed {seed}): public by construction"


def demo_rows(
    data: DataSection, privacy: PrivacySection, num_tickets: int, *, seed: int = DEMO_SEED
) -> list[dict[str, str]]:
    """Fake tickets with the contract's column names (see module docstring); every value is text.

    Args:
        data: the contract's data section, whose columns the rows get.
        privacy: the contract's privacy section, whose ``unit_key`` (and unit) the rows get.
        num_tickets: tickets to generate (one row each), ≥ 1.
        seed: the demo generator's seed.

    Returns:
        ``num_tickets`` dicts. Without a unit key (row level) rows carry only the training columns. A conversations
        contract (``data.record_format: messages``) gets each ticket as a one-exchange conversation (message → user
        turn, reply → assistant turn) in its messages column, as training reads conversations.

    Raises:
        BadInputError: ``num_tickets`` < 1.
    """
    out = []
    for t in generate_tickets(num_tickets=num_tickets, seed=seed):
        row = {}
        if data.text_column:
            row[data.text_column] = f"{t['message']}\n{t['reply']}"
        elif data.completion_column is not None:  # TRL conversational prompt/completion: the reply is the completion
            row[data.messages_key] = [{"role": "user", "content": t["message"]}]
            row[data.completion_column] = [{"role": "assistant", "content": t["reply"]}]
        elif data.messages_key is not None:  # a conversations contract: the ticket as one user → assistant exchange
            row[data.messages_key] = [
                {"role": "user", "content": t["message"]},
                {"role": "assistant", "content": t["reply"]},
            ]
        else:
            row[data.prompt_column], row[data.response_column] = t["message"], t["reply"]
        if privacy.unit_key:
            row[privacy.unit_key] = t["customer_id"] if privacy.protected_unit is ProtectedUnit.USER else t["ticket_id"]
        out.append(row)
    return out


def _same_file(a: Path, b: str | None) -> bool:
    try:
        return b is not None and Path(b).exists() and a.exists() and a.samefile(b)
    except OSError:
        return False


def refuse_private(data: DataSection, path: Path, option: str) -> None:
    """Refuse ``path`` when it is the contract's training file (or its held-out file not declared public);
    ``data`` is the contract's data section.

    Raises:
        BadInputError: naming the option and the contract key it collides with.
    """
    if _same_file(Path(path), data.path):
        raise BadInputError(
            f"{option} {excerpt(str(path), 200)} is the contract's data.path (private training data): measuring it "
            "needs a DP quantile charged to the ledger, which dplora does not do; give a public file or omit it"
        )
    if not data.eval_public and _same_file(Path(path), data.eval_path):
        raise BadInputError(
            f"{option} {excerpt(str(path), 200)} is the contract's data.eval_path, which is not declared public "
            "(data.eval_public: false)"
        )


def public_table(
    data: DataSection, privacy: PrivacySection, path: Path | None, *, num_tickets: int, option: str, units: bool
):
    """The public sample as a ``datasets.Dataset`` with the contract's columns, and where it came from in words.

    Args:
        data: the contract's data section (its columns; its data files are never read).
        privacy: the contract's privacy section (its unit key, with ``units``).
        path: a user-declared public file (csv, jsonl, parquet), or None for the demo generator.
        num_tickets: demo tickets to generate when ``path`` is None.
        option: the CLI option that named ``path`` (for messages).
        units: the sample needs the contract's unit key column (per-unit measurements).

    Returns:
        (table, source): ``source`` names the file (never its content) or the demo generator.

    Raises:
        BadInputError: ``path`` is the contract's private data, unreadable, or lacks a needed column.
    """
    import datasets

    from dplora.data import units as data_mod

    if path is None:
        rows = demo_rows(data, privacy, num_tickets)
        return datasets.Dataset.from_list(rows), DEMO_SOURCE.format(seed=DEMO_SEED)
    refuse_private(data, path, option)
    update = {"path": str(path), "format": "auto", "eval_path": None, "eval_fraction": None, "eval_public": False}
    public = data.model_copy(update={**update, "label_column": None})
    unit_key = privacy.unit_key if units else None
    table = data_mod.load_table(public, unit_key=unit_key)  # checks the text and unit-key columns, names rows only
    return table, f"{option} {Path(path).name} (declared public by the user)"


def eval_data(data: DataSection, table) -> DataSection:
    """The data section used to evaluate on a public table: ``label_column`` only if the table has it."""
    label = data.label_column if data.label_column in table.column_names else None
    return data.model_copy(update={"label_column": label})


def public_data(data: DataSection) -> DataSection:
    """The contract's data section pointed at ``data.public_warm_start.path``: the same record format, columns,
    ``train_on``, chat template and warm-start settings; format by the file's suffix; no held-out set, label or
    group. What :func:`warm_start` takes: it holds no private path.

    Raises:
        ValueError: ``data`` has no ``public_warm_start``.
    """
    warm = data.public_warm_start
    if warm is None:
        raise ValueError("the data section has no public_warm_start")
    update = {
        "path": warm.path,
        "format": "auto",
        "eval_path": None,
        "eval_fraction": None,
        "eval_public": False,
        "label_column": None,
        "group_column": None,
    }
    return data.model_copy(update=update)
