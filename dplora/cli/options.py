"""Arguments and options shared by several ``dplora`` commands, each declared once.

Each shared option is made by one factory here (its flag, metavar, bound and the environment variable it defaults
to, in one ``typer.Option`` call); where commands word its help differently (the golden ``--help`` texts), the
factory takes that wording as a parameter. An alias used by several commands is declared here; one command's own
wording is an alias in that command's module, built with the factory here. Options that only share a name
(``--format``, ``--seed``, ``--plot``, ``--public``, ``--base-model``, ``--out``: other choices, types or
meanings) stay with their commands.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    import click
    from typer.models import OptionInfo

# The environment variables the library reads when the option is not given (the library's names:
# dplora.release.keys.SIGNING_KEY_ENV, dplora.release.envelope.DATA_KEY_ENV, dplora.ledger.store.LEDGER_ENV;
# tests/cli/test_options.py checks they agree). Spelled here so that `--help` imports no cryptography.
SIGNING_KEY_ENV = "DPLORA_SIGNING_KEY"
DATA_KEY_ENV = "DPLORA_DATA_KEY"
LEDGER_ENV = "DPLORA_LEDGER"
MOST_THREADS = 1024  # the bound of --threads where a command states one


def json_option(prints: str = "one JSON object instead of lines.") -> OptionInfo:
    """``--json`` (a flag): help ``Print <prints>``; the command then writes exactly one JSON document on stdout
    (or one JSON line per reply: ``generate``). Raises nothing (typer checks the value)."""
    return typer.Option("--json", help=f"Print {prints}")


def signing_key_option(what: str = "Ed25519 private key (PEM).") -> OptionInfo:
    """``--signing-key PATH`` (a PEM file path, or None): help ``<what> Default: $DPLORA_SIGNING_KEY.``; None makes
    the library read ``$DPLORA_SIGNING_KEY`` (:func:`dplora.release.keys.load_private_key`). Raises nothing."""
    return typer.Option(metavar="PATH", help=f"{what} Default: ${SIGNING_KEY_ENV}.")


def data_key_option(what: str = "Data owner's HMAC key.", *, says_default: bool = True) -> OptionInfo:
    """``--data-key PATH`` (the data owner's HMAC-SHA256 key file, or None): help ``<what>``, then
    ``Default: $DPLORA_DATA_KEY.`` where ``says_default`` (None makes the library read it:
    :func:`dplora.release.envelope.load_data_key`). Raises nothing."""
    default = f" Default: ${DATA_KEY_ENV}." if says_default else ""
    return typer.Option(metavar="PATH", help=f"{what}{default}")


LEDGER_DEFAULT = f"Default: ${LEDGER_ENV} or the user data dir."  # train, budget
LEDGER_DB_DEFAULT = f"[default: ${LEDGER_ENV}, else $XDG_DATA_HOME/dplora/ledger.sqlite3]"  # the ledger commands


def ledger_option(
    what: str = "Budget ledger (SQLite).", *, default: str | None = LEDGER_DEFAULT, names: tuple[str, ...] = ()
) -> OptionInfo:
    """``--ledger PATH`` (the SQLite budget ledger, or None: ``$DPLORA_LEDGER``, else the user data dir, as
    :func:`dplora.ledger.store.default_ledger_path`): help ``<what> <default>``; ``names`` adds spellings before
    ``--ledger`` (``ledger``'s sub-commands take ``--db``). Raises nothing."""
    help_text = what if default is None else f"{what} {default}"
    return typer.Option(*names, "--ledger", metavar="PATH", help=help_text)


def threads_option(*, most: int | None = None, says_default: bool = True) -> OptionInfo:
    """``--threads N`` (CPU threads, an int >= 1 and <= ``most`` where given, or None: the cores free right now,
    :func:`dplora.engine.runtime.free_threads`): help ``CPU threads.`` (then the default where ``says_default``);
    typer refuses a value out of bounds with exit 2. Raises nothing itself."""
    default = " Default: the cores free right now." if says_default else ""
    return typer.Option(min=1, max=most, metavar="N", help=f"CPU threads.{default}")


def progress_option(help_text: str = "Report training progress on stderr.") -> OptionInfo:
    """``--progress / --no-progress`` (a bool; progress goes to stderr, never stdout). Raises nothing."""
    return typer.Option(help=help_text)


def overwrite_option(replaces: str = "an existing file") -> OptionInfo:
    """``--overwrite / --no-overwrite`` (a bool): help ``Replace <replaces>.``. Raises nothing."""
    return typer.Option(help=f"Replace {replaces}.")


def show_private_option(help_text: str) -> OptionInfo:
    """``--show-private`` (a flag: also print what is private, NOT covered by DP, where the command would not;
    ``help_text`` says what that is). Raises nothing."""
    return typer.Option("--show-private", help=help_text)


def allow_non_private_option(help_text: str) -> OptionInfo:
    """``--allow-non-private`` (a flag: accept a non-private control run, ``privacy.enabled: false``; ``help_text``
    says for what). Raises nothing."""
    return typer.Option("--allow-non-private", help=help_text)


def public_key_option(help_text: str) -> OptionInfo:
    """``--public-key PATH`` (the signer's Ed25519 public key, PEM). Raises nothing."""
    return typer.Option(metavar="PATH", help=help_text)


def prompts_option(help_text: str) -> OptionInfo:
    """``--prompts FILE`` (a UTF-8 file of prompts; ``help_text`` says its shape). Raises nothing."""
    return typer.Option(metavar="FILE", help=help_text)


def max_new_tokens_option(per: str) -> OptionInfo:
    """``--max-new-tokens N`` (tokens, an int >= 1; :class:`dplora.evaluate.generate.Sampling` refuses over 4096
    with exit 2): help ``Tokens generated at most per <per> (1 … 4096).``. Raises nothing."""
    return typer.Option(min=1, metavar="N", help=f"Tokens generated at most per {per} (1 … 4096).")


def temperature_option(help_text: str) -> OptionInfo:
    """``--temperature`` (a float >= 0: 0 is greedy decoding). Raises nothing."""
    return typer.Option(min=0.0, help=help_text)


ConfigArg = Annotated[Path, typer.Argument(metavar="CONFIG", help="The YAML privacy contract.", show_default=False)]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="KEY=VALUE",
        help="Overrides with dotted keys, e.g. training.lr=1e-3 privacy.target_epsilon=8.",
        show_default=False,
    ),
]
RunArg = Annotated[
    Path, typer.Argument(metavar="RUN_OR_CONFIG", help="A finished run folder, or the contract that wrote it.")
]
JsonLinesOpt = Annotated[bool, json_option()]
JsonLineOpt = Annotated[bool, json_option("one JSON document instead of a line.")]
SigningKeyOpt = Annotated[Path | None, signing_key_option()]
LedgerOpt = Annotated[Path | None, ledger_option()]
ThreadsOpt = Annotated[int | None, threads_option()]
TuningThreadsOpt = Annotated[int | None, threads_option(most=MOST_THREADS, says_default=False)]
TrainingProgressOpt = Annotated[bool, progress_option()]
ReplaceFileOpt = Annotated[bool, overwrite_option()]
TopPOpt = Annotated[float, typer.Option(help="Nucleus mass kept when sampling, in (0, 1].")]
SeedOpt = Annotated[int | None, typer.Option(metavar="N", help="Seed for sampling. Default: OS entropy.")]
# A release moved from where it was trained: the files its contract names by a path that no longer resolves, each
# checked against the signed record's digests (dplora.release.locate.locate_inputs).
ReleaseDataOpt = Annotated[
    Path | None,
    typer.Option(
        "--data",
        metavar="FILE",
        help="The run's training data when its data.path does not resolve here (a moved release); checked against "
        "the record's data digest.",
    ),
]
ReleaseModelOpt = Annotated[
    Path | None,
    typer.Option(
        "--model",
        metavar="PATH",
        help="The base model folder or .gguf file when the run's model.path does not resolve here (a moved "
        "release); checked against the record's base-model digests.",
    ),
]
ReleaseDataKeyOpt = Annotated[
    Path | None, data_key_option("The data owner's HMAC key, to check --data against the record's keyed digest.")
]


def _expand(value):
    """A path (or a list/tuple of paths) with a leading ``~``/``~user`` expanded; anything else unchanged."""
    if isinstance(value, Path):
        return Path(os.path.expanduser(value))
    if isinstance(value, list | tuple):
        return type(value)(_expand(v) for v in value)
    return value


def expand_user_paths(command: click.Command) -> None:
    """Expand a leading ``~`` in every path argument and option of ``command`` and its subcommands (in place).

    Done once, on the whole command tree (each parameter's click ``callback`` is wrapped, after typer made the
    value a ``Path``), so every path any command declares expands ``~`` as a shell would; ``--key=~/k.pem`` and
    quoted paths reach the program unexpanded otherwise. Text values (``--prompt``) are not paths: unchanged.
    """
    for param in command.params:
        if getattr(param, "_dplora_expands_user", False):
            continue
        inner = param.callback

        def callback(ctx, par, value, inner=inner):
            value = _expand(value)
            return inner(ctx, par, value) if inner is not None else value

        param.callback, param._dplora_expands_user = callback, True
    for sub in getattr(command, "commands", {}).values():
        expand_user_paths(sub)
