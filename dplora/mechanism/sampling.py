"""Poisson sampling over protected units: the single-process sampler and its sharded form for W ranks.

Each unit joins a logical batch independently with probability q (Abadi et al. 2016; Opacus
``UniformWithReplacementSampler``), from OS entropy, never from the recorded seed. Under W ranks unit u belongs to
rank u mod W and each rank samples its own shard with its own generator, so the union over ranks is one Poisson
sample at rate q over all N units (:mod:`dplora.engine.distributed` for the process setup).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dplora.engine.distributed import World


class PoissonUnitSampler:
    """Poisson sampling over protected units: each unit joins a logical batch independently with probability q.

    The randomness comes from OS entropy (``numpy.random.default_rng()`` with no seed), never from the
    recorded seed, so nobody holding the release record can regenerate batch membership. Empty batches
    happen and must still be stepped (Abadi et al. 2016; Opacus ``UniformWithReplacementSampler``).

    Args:
        num_units: N.
        sample_rate: q ∈ (0, 1].
        rng: only for tests; production passes None.
    """

    def __init__(self, num_units: int, sample_rate: float, rng: np.random.Generator | None = None):
        if not 0 < sample_rate <= 1:
            raise ValueError(f"Expected 0 < sample_rate <= 1, got {sample_rate}")
        self.num_units = num_units
        self.sample_rate = sample_rate
        self._rng = rng if rng is not None else np.random.default_rng()

    def sample(self) -> np.ndarray:
        """Unit indices of one logical batch, shape (k,) with k ~ Binomial(N, q) (k = 0 happens)."""
        return np.flatnonzero(self._rng.random(self.num_units) < self.sample_rate)


def shard_units(num_units: int, world: World) -> np.ndarray:
    """The global unit indices of ``world.rank``'s shard, shape (⌈(N - rank)/W⌉,): u with u mod W == rank."""
    return np.arange(world.rank, num_units, world.world_size, dtype=np.int64)


class ShardedPoissonSampler:
    """Poisson sampling of this rank's shard at rate q, from this rank's own OS-entropy generator.

    Args:
        num_units: N, units over all ranks.
        sample_rate: q ∈ (0, 1].
        world: this process and W.
        rng: only for tests; production passes None (a fresh unseeded ``numpy`` generator per process).
    """

    def __init__(self, num_units: int, sample_rate: float, world: World, rng: np.random.Generator | None = None):
        self.shard = shard_units(num_units, world)
        self._sampler = PoissonUnitSampler(len(self.shard), sample_rate, rng)

    def sample(self) -> np.ndarray:
        """Global unit indices this rank holds in one logical batch, increasing, shape (k,) (k = 0 happens)."""
        return self.shard[self._sampler.sample()]


def expected_units_per_rank(sample_rate: float, num_units: int, world_size: int) -> tuple[float, float]:
    """(smallest, largest) expected units per rank per logical step: q·⌊N/W⌋ and q·⌈N/W⌉ (round-robin shards)."""
    return sample_rate * (num_units // world_size), sample_rate * -(-num_units // world_size)


def unit_sampler(num_units: int, sample_rate: float, world: World):
    """The run's sampler over N units at rate q: :class:`PoissonUnitSampler` in one process, or this rank's
    :class:`ShardedPoissonSampler` under W > 1 processes; both from fresh OS entropy, never the recorded seed.

    Args:
        num_units: N, protected units over all ranks.
        sample_rate: q ∈ (0, 1].
        world: the run's processes (:class:`dplora.engine.distributed.World`).
    Returns:
        An object whose ``sample()`` gives one logical batch's unit indices, shape (k,), increasing.
    Raises:
        ValueError: q outside (0, 1].
    Source: Abadi et al. 2016 (Poisson sampling); Opacus ``UniformWithReplacementSampler``.
    """
    if world.distributed:
        return ShardedPoissonSampler(num_units, sample_rate, world)
    return PoissonUnitSampler(num_units, sample_rate)
