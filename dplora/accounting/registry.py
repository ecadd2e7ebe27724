"""Accountants as objects behind one interface, found by name in one registry.

After dp_accounting's ``privacy_accountant.py`` (an accountant is built for one neighbouring relation and says
with ``supports(event)`` whether it can account an event) and Opacus's ``accountants/registry.py`` (accountants
are found by name; an unknown name raises). An accountant is a :class:`PrivacyAccountant` subclass registered
under its ``name``; the built-in ones (Opacus RDP and PRV, dp_accounting PLD) are in
:mod:`dplora.accounting.accountants`, registered when ``dplora.accounting`` is imported. The registry keys of the
built-ins are the values of :class:`~dplora.accounting.events.Accountant`, the enum the contract validates
``privacy.accountant`` against; an accountant registered elsewhere (a test's) is found by its name as well.

Everything in ``dplora.accounting`` that depends on which accountant is used (ε, the library version, the
supported relations, the working range, the checked chain, the calibration tolerance, the composition of several
runs) asks the accountant's object; no module branches on the accountant's name.
"""

from __future__ import annotations

import abc
import importlib.metadata
from typing import ClassVar

from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent, Sampler
from dplora.errors import BadInputError, UnsupportedAccountingError

_REGISTRY: dict[str, type[PrivacyAccountant]] = {}


class PrivacyAccountant(abc.ABC):
    """One accountant of Poisson-subsampled Gaussian DP-SGD events, for one neighbouring relation.

    Class attributes (set by each subclass):
        name: the registry key, e.g. ``"rdp"`` (for the built-ins, the :class:`Accountant` value).
        package: the distribution that computes ε, e.g. ``"opacus"`` (its installed version goes into the record).
        relations: the neighbouring relations it accounts.
        rtol: the relative tolerance of a σ calibrated with it first in the chain.
        chain: the registry names tried in order when this accountant is asked for a checked ε (the RDP floor
            and fallback follow under add/remove); ``()`` means RDP alone.
        refusal_hint: appended to the "target cannot be reached" refusal when calibration with it fails.
        composition_method: how it composes several runs (``None``: it does not compose runs).

    Args:
        adjacency: the neighbouring relation ε refers to (as dp_accounting's ``neighboring_relation``); an
            unsupported one is accepted here and refused by :meth:`require_supported`.

    Raises:
        ValueError: ``adjacency`` is not an :class:`Adjacency`.
    """

    name: ClassVar[str]
    package: ClassVar[str]
    relations: ClassVar[frozenset[Adjacency]] = frozenset({Adjacency.ADD_REMOVE})
    rtol: ClassVar[float] = 4e-3
    chain: ClassVar[tuple[str, ...] | None] = None  # None: the accountant alone, (name,)
    refusal_hint: ClassVar[str] = ""
    composition_method: ClassVar[str | None] = None

    def __init__(self, adjacency: Adjacency | str = Adjacency.ADD_REMOVE) -> None:
        self.adjacency = Adjacency(adjacency)

    @classmethod
    def version(cls) -> str:
        """Library and version that computes ε, e.g. ``"opacus 1.6.0"`` (``importlib.metadata``)."""
        return f"{cls.package} {importlib.metadata.version(cls.package)}"

    def supports(self, event) -> bool:
        """Whether this accountant can account ``event``: a Poisson :class:`DpSgdEvent` of its relation."""
        return (
            isinstance(event, DpSgdEvent)
            and event.sampler is Sampler.POISSON
            and event.adjacency is self.adjacency
            and self.adjacency in self.relations
        )

    def unsupported_message(self) -> str:
        """The refusal for an unsupported relation (subclasses may say why)."""
        offered = ", ".join(sorted(a.value for a in self.relations))
        return f"accountant={self.name} supports only adjacency={offered}, not adjacency={self.adjacency.value}"

    def require_supported(self) -> None:
        """Raise UnsupportedAccountingError unless this accountant accounts its relation."""
        if self.adjacency not in self.relations:
            raise UnsupportedAccountingError(self.unsupported_message())

    def require_supports(self, event) -> None:
        """Raise UnsupportedAccountingError unless :meth:`supports` ``event`` (the relation's refusal first).

        Raises:
            UnsupportedAccountingError: the relation, or another property of ``event``, is not supported.
        """
        self.require_supported()
        if not self.supports(event):
            raise UnsupportedAccountingError(f"accountant={self.name} does not account the event {event!r}")

    def numerical_chain(self) -> tuple[str, ...]:
        """The registry names tried in order for a checked ε (see :attr:`chain`).

        Raises:
            UnsupportedAccountingError: the relation is not supported.
        """
        self.require_supported()
        return (self.name,) if self.chain is None else tuple(self.chain)

    @abc.abstractmethod
    def epsilons(self, event: DpSgdEvent, delta: float, steps: list[int], tolerance=None) -> list[float]:
        """ε (unitless, natural log) after each step count in ``steps``, the library's own number, unchecked.

        Called with σ > 0 and a supported event (see :func:`dplora.accounting.backends.epsilons`).

        Args:
            event: q, σ and adjacency (its ``steps`` is ignored).
            delta: δ ∈ (0, 1).
            steps: step counts (integers ≥ 0).
            tolerance: a :class:`dplora.accounting.cost.Tolerance`, or None for the library's defaults.

        Raises:
            AccountingNumericalError: the library failed numerically.
        """

    def out_of_range(self, event: DpSgdEvent, delta: float, tolerance) -> str | None:
        """Why it must not be called on ``event`` (``event.steps`` the largest count) at ``delta``; None: it may."""
        return None

    def compose(self, history: list[tuple[float, float, int]], delta: float) -> float:
        """ε at ``delta`` of several runs' (σ, q, T) composed (only where :attr:`composition_method` is set)."""
        raise NotImplementedError(f"accountant={self.name} does not compose runs")


def register(cls: type[PrivacyAccountant]) -> type[PrivacyAccountant]:
    """Add an accountant class under ``cls.name`` (usable as a class decorator); returns ``cls``.

    Raises:
        TypeError: ``cls`` is not a :class:`PrivacyAccountant` subclass.
        ValueError: its name is empty or already taken by another class.
    """
    if not (isinstance(cls, type) and issubclass(cls, PrivacyAccountant)):
        raise TypeError(f"expected a PrivacyAccountant subclass, got {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__qualname__} needs a non-empty string name")
    old = _REGISTRY.get(name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"accountant name {name!r} is already registered by {old.__module__}.{old.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def names() -> tuple[str, ...]:
    """The registered names, in registration order (built-ins: ``"prv"``, ``"rdp"``, ``"pld"``)."""
    return tuple(_REGISTRY)


def get(name: Accountant | str) -> type[PrivacyAccountant]:
    """The accountant class registered under ``name`` (an :class:`Accountant` member or its value).

    Raises:
        BadInputError: no accountant is registered under ``name`` (exit code 2; the message names those offered).
    """
    cls = _REGISTRY.get(name.value if isinstance(name, Accountant) else name) if isinstance(name, str) else None
    if cls is None:
        offered = ", ".join(repr(n) for n in _REGISTRY)
        raise BadInputError(
            f"accountant={name!r} is not offered; use one of {offered} (no GDP/CLT: it underestimates ε)"
        )
    return cls


def make(name: Accountant | str, adjacency: Adjacency | str) -> PrivacyAccountant:
    """The accountant registered under ``name``, built for ``adjacency``.

    Raises:
        BadInputError: unknown name.
        ValueError: ``adjacency`` is not an :class:`Adjacency`.
    """
    return get(name)(adjacency)


def key(name: Accountant | str) -> Accountant | str:
    """The form plans and curves carry: the :class:`Accountant` member for a built-in, else the registered name.

    Raises:
        BadInputError: unknown name.
    """
    name = get(name).name
    try:
        return Accountant(name)
    except ValueError:
        return name
