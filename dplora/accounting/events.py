"""Mechanism descriptions: what an accountant needs, as immutable data (after dp_accounting's ``DpEvent``).

The release record stores :meth:`DpSgdEvent.to_dict` verbatim, so a reviewer can recompute ε with any
accountant. Never change what a field means: add a new class instead.
"""

from __future__ import annotations

import dataclasses
import enum
import math


class Accountant(str, enum.Enum):
    """Privacy accountants dplora offers for signed releases (no GDP/CLT approximation)."""

    PRV = "prv"  # Opacus PRVAccountant (Gopi et al. 2021), add/remove only
    RDP = "rdp"  # Opacus RDP analysis (Mironov 2017; Mironov et al. 2019), add/remove only
    PLD = "pld"  # Google dp_accounting PLDAccountant (Doroshenko et al. 2022), both adjacencies


class Adjacency(str, enum.Enum):
    """Neighbouring relation between datasets, over protected units."""

    ADD_REMOVE = "add_remove"
    REPLACE_ONE = "replace_one"


class Sampler(str, enum.Enum):
    """How each logical batch of protected units is drawn."""

    POISSON = "poisson"


def sensitivity(adjacency: Adjacency, max_grad_norm: float) -> float:
    """L2 sensitivity of the sum of unit contributions each clipped to ``max_grad_norm`` (C).

    Args:
        adjacency: the neighbouring relation.
        max_grad_norm: C, the flat L2 clip norm over all trainable LoRA parameters.

    Returns:
        C under add/remove, 2C under replace-one (jax_privacy ``sensitivity(relation)``).

    Raises:
        ValueError: unknown relation.
    """
    match Adjacency(adjacency):
        case Adjacency.ADD_REMOVE:
            return float(max_grad_norm)
        case Adjacency.REPLACE_ONE:
            return 2.0 * float(max_grad_norm)
    raise ValueError(f"unknown adjacency={adjacency!r}")  # pragma: no cover


@dataclasses.dataclass(frozen=True, kw_only=True)
class DpSgdEvent:
    """T self-compositions of a Poisson-subsampled Gaussian mechanism (DP-SGD, Abadi et al. 2016).

    Attributes:
        sample_rate: q, the probability that one protected unit joins a logical batch (0 < q ≤ 1).
        noise_multiplier: σ; the noise standard deviation is σ·C for clip norm C (add/remove sensitivity).
        steps: T, the number of logical steps (noise draws), an integer ≥ 0.
        adjacency: the neighbouring relation the ε refers to.
        sampler: how batches are drawn; only Poisson sampling is accounted.
    """

    sample_rate: float
    noise_multiplier: float
    steps: int
    adjacency: Adjacency = Adjacency.ADD_REMOVE
    sampler: Sampler = Sampler.POISSON

    def __post_init__(self) -> None:
        if not (isinstance(self.sample_rate, (int, float)) and 0.0 < self.sample_rate <= 1.0):
            raise ValueError(f"Expected 0 < sample_rate <= 1, got sample_rate={self.sample_rate!r}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0.0):
            raise ValueError(f"Expected noise_multiplier >= 0 and finite, got {self.noise_multiplier!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise ValueError(f"Expected an integer steps >= 0, got steps={self.steps!r}")
        object.__setattr__(self, "adjacency", Adjacency(self.adjacency))
        object.__setattr__(self, "sampler", Sampler(self.sampler))

    def to_dict(self) -> dict:
        """JSON-ready description, as stored in the release record."""
        return {
            "mechanism": "dp_sgd",
            "event": "SelfComposed(PoissonSampled(Gaussian))",
            "sampler": self.sampler.value,
            "sample_rate": self.sample_rate,
            "noise_multiplier": self.noise_multiplier,
            "steps": self.steps,
            "adjacency": self.adjacency.value,
        }

    @classmethod
    def from_dict(cls, entry: dict, *, adjacency: Adjacency | str | None = None) -> DpSgdEvent:
        """The event of a serialised entry (:meth:`to_dict`'s form: the record's ``mechanism``, a ledger charge's
        events, a composed run), the one reader of that form.

        Args:
            entry: ``sample_rate`` (q), ``noise_multiplier`` (σ), ``steps`` (T), ``adjacency`` and optionally
                ``sampler`` (default Poisson); other keys (``mechanism``, ``event``, ``accountant``) are ignored.
            adjacency: the relation to use instead of the entry's own (a ledger charge states it once).
        Raises:
            KeyError: a required key is missing.
            TypeError: ``entry`` is not a mapping.
            ValueError: a value is out of range (see the class).
        """
        if not isinstance(entry, dict):
            raise TypeError(f"a DP-SGD event entry must be a dict, got {type(entry).__name__}")
        sigma = entry["noise_multiplier"]
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)):
            raise ValueError(f"Expected a number noise_multiplier, got {sigma!r}")
        return cls(
            sample_rate=entry["sample_rate"],
            noise_multiplier=float(sigma),
            steps=entry["steps"],
            adjacency=entry["adjacency"] if adjacency is None else adjacency,
            sampler=entry.get("sampler", Sampler.POISSON),
        )

    def to_dp_accounting(self):
        """The equivalent ``dp_accounting.SelfComposedDpEvent`` (imports dp_accounting lazily)."""
        import dp_accounting

        step = dp_accounting.PoissonSampledDpEvent(
            self.sample_rate, dp_accounting.GaussianDpEvent(self.noise_multiplier)
        )
        return dp_accounting.SelfComposedDpEvent(step, self.steps)
