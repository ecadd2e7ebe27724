"""dplora.mechanism.reduction: the one all-reduce per logical step, on a real single-process gloo group.

The reducer only asks its World whether it is rank 0; the all-reduce over a one-process group returns this
process's own buffer, so the reduced values are known exactly: rank 0's clipped sum plus the noise that a
ChaCha20 generator with a fixed key draws (drawn again from the same key as the reference), over the public E.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dplora.engine.distributed import SINGLE, World
from dplora.errors import TrainingFailedError
from dplora.mechanism.clipping import UnitClipAccumulator
from dplora.mechanism.noise import CsprngGaussian
from dplora.mechanism.reduction import FollowerSignals, StepReducer, common_forward_count, step_reducer

KEY = bytes(range(40, 72))
RANK0 = World(rank=0, world_size=2, backend="gloo")
RANK1 = World(rank=1, world_size=2, backend="gloo")


@pytest.fixture
def group():
    """A one-process gloo group for the test, torn down after it."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def accumulator(rows, units, clip):
    acc = UnitClipAccumulator(rows.shape[1], clip, "cpu")
    acc.add(rows.clone(), torch.tensor(units))
    return acc


def rows_and_hand_sum(clip):
    """Four records in three units, and Σ_u min(1, C/‖v_u‖)·v_u by hand (float64)."""
    rows = torch.tensor([[3.0, 0.0, 4.0, 0.0], [0.0, 0.1, 0.0, 0.0], [0.2, 0.0, 0.0, 0.2], [1.0, -1.0, 1.0, -1.0]])
    units = [0, 1, 1, 2]
    want = torch.zeros(4, dtype=torch.float64)
    for members in ([0], [1, 2], [3]):
        v = rows[members].double().sum(0)
        want += v * min(1.0, clip / float(v.norm()))
    return rows, units, want


def test_rank_0_adds_one_sigma_c_draw_and_divides_by_the_public_e(group):
    """(Σ clipped + N(0, (σC)² I)) / E with E = 7 (not the 3 units seen); the totals are the step's counts."""
    sigma, clip, E = 1.5, 1.2, 7.0
    rows, units, want = rows_and_hand_sum(clip)
    reducer = StepReducer(RANK0, 4, "cpu")
    assert reducer.buffer.shape == (4 + StepReducer.EXTRA,)
    reducer.set_local(3, 4, 2.5)
    gen = CsprngGaussian(key=KEY)
    out = reducer.privatize(accumulator(rows, units, clip), noise_multiplier=sigma, max_grad_norm=clip,
                            expected_batch_size=E, generator=gen)  # fmt: skip
    noise = CsprngGaussian(key=KEY).normal(4, sigma * clip).double()
    torch.testing.assert_close(out.double(), (want + noise) / E, rtol=1e-6, atol=1e-6)
    assert gen.draws == 1 and reducer.noise_draws == 1
    assert reducer.totals == {"units": 3, "records": 4, "loss_sum": 2.5, "noise_draws": 1, "failed_ranks": 0,
                              "stop": 0}  # fmt: skip


def test_each_step_draws_anew(group):
    """Two empty steps: draws 0 and 1 of the key (an empty Poisson batch still gets its noise), σC each."""
    sigma, clip, E = 0.8, 2.0, 3.0
    reducer, gen = StepReducer(RANK0, 300, "cpu"), CsprngGaussian(key=KEY)
    acc = UnitClipAccumulator(300, clip, "cpu")
    ref = CsprngGaussian(key=KEY)
    for _ in range(2):
        acc.begin_step()
        reducer.set_local(0, 0, 0.0)
        out = reducer.privatize(acc, noise_multiplier=sigma, max_grad_norm=clip, expected_batch_size=E,
                                generator=gen)  # fmt: skip
        torch.testing.assert_close(out.double() * E, ref.normal(300, sigma * clip).double(), rtol=1e-6, atol=1e-6)
    assert gen.draws == 2 and reducer.noise_draws == 2


def test_a_follower_never_draws_and_a_step_without_a_draw_fails(group):
    """Rank 1 copies its clipped sum without noise; reduced alone (no rank 0) the step has 0 draws and raises."""
    follower, gen = StepReducer(RANK1, 4, "cpu"), CsprngGaussian(key=KEY)
    rows, units, want = rows_and_hand_sum(1.0)
    with pytest.raises(TrainingFailedError, match="drawn 0 times"):
        follower.privatize(accumulator(rows, units, 1.0), noise_multiplier=1.0, max_grad_norm=1.0,
                           expected_batch_size=2.0, generator=gen)  # fmt: skip
    assert gen.draws == 0
    torch.testing.assert_close(follower.buffer[:4].double(), want, rtol=1e-6, atol=1e-7)  # no noise in it


def test_a_failed_rank_raises_its_own_error_and_contributes_nothing(group):
    reducer, gen = StepReducer(RANK0, 4, "cpu"), CsprngGaussian(key=KEY)
    reducer.fail(RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        reducer.privatize(UnitClipAccumulator(4, 1.0, "cpu"), noise_multiplier=1.0, max_grad_norm=1.0,
                          expected_batch_size=1.0, generator=gen)  # fmt: skip
    assert gen.draws == 0 and reducer.totals["failed_ranks"] == 1
    assert float(reducer.buffer[:4].abs().sum()) == 0.0
    # an open unit at the end of the step is this rank's failure too; the reducer is usable again afterwards
    acc = UnitClipAccumulator(4, 1.0, "cpu")
    acc.add(torch.ones(1, 4), torch.tensor([0]), last_unit_continues=True)
    with pytest.raises(TrainingFailedError, match="still open"):
        reducer.privatize(acc, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=1.0, generator=gen)
    acc.begin_step()
    reducer.privatize(acc, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=1.0, generator=gen)
    assert gen.draws == 1 and reducer.totals["failed_ranks"] == 0


def test_a_stop_request_reaches_the_totals_and_stops_the_follower_after_the_step(group):
    reducer = StepReducer(RANK1, 2, "cpu")
    signals = FollowerSignals(reducer)
    assert signals.name is None and not reducer.stop_requested()
    signals.after_step(None, None)  # nothing asked: no stop
    reducer.stop_requested = lambda: True
    with pytest.raises(TrainingFailedError):  # rank 1 alone: no draw
        reducer.privatize(UnitClipAccumulator(2, 1.0, "cpu"), noise_multiplier=1.0, max_grad_norm=1.0,
                          expected_batch_size=1.0, generator=CsprngGaussian(key=KEY))  # fmt: skip
    assert reducer.totals["stop"] == 1
    with pytest.raises(KeyboardInterrupt, match="after step 5"):
        signals.after_step(None, type("State", (), {"step": 5})())


def test_step_reducer_only_for_several_processes():
    assert step_reducer(SINGLE, 4, "cpu") is None
    reducer = step_reducer(RANK0, 4, "cpu")
    assert isinstance(reducer, StepReducer) and reducer.P == 4 and reducer.buffer.shape == (10,)


def test_common_forward_count(group):
    assert common_forward_count(SINGLE, 3, "cpu") == 3  # one process: no collective
    assert common_forward_count(RANK0, 5, "cpu") == 5  # the MAX over the (one-process) group


def _two_rank_step(rank, store_path, rows, units, queue):
    """One logical step on rank ``rank`` of a real two-process gloo group (run in a forked child)."""
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    try:
        reducer = StepReducer(World(rank=rank, world_size=2, backend="gloo"), rows.shape[1], "cpu")
        reducer.set_local(len(set(units)), len(units), 1.0)
        gen = CsprngGaussian(key=KEY)
        out = reducer.privatize(accumulator(rows, units, 1.0), noise_multiplier=0.5, max_grad_norm=1.0,
                                expected_batch_size=4.0, generator=gen)  # fmt: skip
        queue.put((rank, out.tolist(), gen.draws, reducer.totals))
    finally:
        dist.destroy_process_group()


def test_two_ranks_sum_their_clipped_sums_and_rank_0_draws_once(tmp_path):
    """Two forked processes: each gets (Σ_ranks clipped sums + rank 0's one draw) / E; rank 1 never draws."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    rows, units, want = rows_and_hand_sum(1.0)
    queue = ctx.Queue()
    shards = [(rows[:2], units[:2]), (rows[2:], [5, 6])]  # rank 1 holds unit 1's second record as its own unit
    procs = [ctx.Process(target=_two_rank_step, args=(r, str(tmp_path / "store"), *shards[r], queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    want = torch.zeros(4, dtype=torch.float64)
    for v in (rows[0], rows[1], rows[2], rows[3]):  # four units after sharding, each clipped on its rank
        want += v.double() * min(1.0, 1.0 / float(v.double().norm()))
    noise = CsprngGaussian(key=KEY).normal(4, 0.5).double()
    for rank, out, draws, totals in results:
        torch.testing.assert_close(torch.tensor(out, dtype=torch.float64), (want + noise) / 4.0, rtol=1e-6, atol=1e-6)
        assert draws == (1 if rank == 0 else 0)
        assert totals["noise_draws"] == 1 and totals["units"] == 4 and totals["records"] == 4
