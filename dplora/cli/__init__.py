"""The command line: one module per command group (`app`: train, validate, budget, verify, eval, ...; `audit`,
`ledger`, `synth`, `tuning`), each only parsing options and calling the library.

May import: everything.
"""


def main() -> None:
    """Run the ``dplora`` command (the console script ``dplora.cli:main`` and ``python -m dplora``)."""
    from dplora.cli.app import main as run

    run()
