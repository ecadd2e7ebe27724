"""One rank of tests/engine/test_distributed_inputs.py, started by ``torchrun --nproc-per-node 2``.

``python dist_train_worker.py OUT DIR0 DIR1 ARGS...``: rank r works in DIR r, which holds its own copy of the
contract's relative ``data.path`` (as on two machines), runs ``dplora ARGS`` in the process group, and writes its
exit code to OUT/rank<r>.json.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from workers_common import run_app_and_record


def main(out: Path, dirs: list[str], args: list[str]) -> None:
    warnings.filterwarnings("ignore")
    rank = int(os.environ["RANK"])
    os.chdir(dirs[rank])
    from dplora.cli.app import app

    run_app_and_record(app, args, out, rank)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:4], sys.argv[4:])
