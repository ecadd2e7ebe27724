"""``python -m dplora …``: the same CLI as the ``dplora`` command (an entry point for torchrun/accelerate)."""

from dplora.cli.app import main

if __name__ == "__main__":
    main()
