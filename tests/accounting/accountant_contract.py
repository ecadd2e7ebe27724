"""What every accountant must do: one test class that each accountant's tests inherit (issue 44, item 3).

After dp_accounting's ``privacy_accountant_test.py`` (one base test class, subclassed per accountant). A subclass
sets ``name`` (the registry name) and ``references``: published (q, σ, T, δ, adjacency, ε, tolerance) values the
accountant must reproduce; it may set ``monotone`` (q, σ and the step counts checked) and ``unsupported`` (events
it must refuse beyond the relations it does not support). Not collected itself (no ``test_`` prefix).
"""

from __future__ import annotations

import importlib.metadata
import math
import re

import pytest

from dplora.accounting import backends, registry
from dplora.accounting.checked import FLOOR, checked_curve, numerical_chain
from dplora.accounting.cost import Tolerance, out_of_range
from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent
from dplora.errors import UnsupportedAccountingError

VERSION = re.compile(r"[a-z][a-z0-9_.-]* \d+(\.\d+)+\S*")  # "opacus 1.6.0", "dp-accounting 0.6.0"


def event(q: float, sigma: float, steps: int = 1, adjacency: str = "add_remove") -> DpSgdEvent:
    return DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps, adjacency=adjacency)


class AccountantContract:
    """Inherited by each accountant's test class; the subclass supplies the accountant and its reference values."""

    name: str
    references: tuple[tuple[float, float, int, float, str, float, float], ...]
    monotone: tuple[float, float, tuple[int, ...]] = (0.01, 1.0, (1, 10, 100, 300))
    unsupported: tuple[DpSgdEvent, ...] = ()

    def account(self, adjacency: str = "add_remove") -> registry.PrivacyAccountant:
        return registry.make(self.name, adjacency)

    def supported(self) -> list[Adjacency]:
        return [a for a in Adjacency if a in registry.get(self.name).relations]

    def test_registry_round_trip(self):
        cls = registry.get(self.name)
        assert cls.name == self.name and self.name in registry.names()
        for adjacency in Adjacency:
            made = registry.make(self.name, adjacency.value)
            assert type(made) is cls and made.adjacency is adjacency
        key = registry.key(self.name)
        assert key == self.name and registry.get(key) is cls
        if self.name in {a.value for a in Accountant}:  # a contract accountant: plans carry the enum member
            assert key is Accountant(self.name) and registry.get(Accountant(self.name)) is cls

    def test_version_string(self):
        cls = registry.get(self.name)
        version = backends.accountant_version(self.name)
        assert VERSION.fullmatch(version), version
        assert version == cls.version() == f"{cls.package} {importlib.metadata.version(cls.package)}"

    def test_published_reference_values(self):
        assert self.references, "each accountant is pinned to at least one published value"
        for q, sigma, steps, delta, adjacency, expected, tol in self.references:
            got = backends.epsilons(event(q, sigma, steps, adjacency), delta, self.name, [steps])[0]
            assert got == pytest.approx(expected, abs=tol), (q, sigma, steps, delta, adjacency)

    def test_epsilon_non_negative_zero_at_no_steps_infinite_without_noise(self):
        q, sigma, steps = self.monotone
        for adjacency in self.supported():
            values = backends.epsilons(event(q, sigma, adjacency=adjacency.value), 0.5, self.name, [0, steps[0]])
            assert values[0] == 0.0 and values[1] >= 0.0  # at δ = 0.5 RDP's conversion alone goes below 0
            no_noise = backends.epsilons(event(q, 0.0, adjacency=adjacency.value), 1e-5, self.name, [0, 10])
            assert no_noise == [0.0, math.inf]

    def test_monotone_in_steps_and_in_noise(self):
        q, sigma, steps = self.monotone
        for adjacency in self.supported():
            low = backends.epsilons(event(q, sigma, adjacency=adjacency.value), 1e-5, self.name, list(steps))
            assert all(v > 0 and math.isfinite(v) for v in low)
            assert low == sorted(low) and low[-1] > low[0], low
            more = backends.epsilons(event(q, 2 * sigma, adjacency=adjacency.value), 1e-5, self.name, [steps[-1]])
            assert more[0] < low[-1]

    def test_the_object_is_what_backends_call(self):
        q, sigma, steps = self.monotone
        raw = self.account().epsilons(event(q, sigma), 1e-5, list(steps), Tolerance())
        assert backends.epsilons(event(q, sigma), 1e-5, self.name, list(steps), Tolerance()) == raw

    def test_supports_and_refuses_the_unsupported(self):
        q, sigma, _ = self.monotone
        for adjacency in Adjacency:
            account = self.account(adjacency.value)
            e = event(q, sigma, 10, adjacency.value)
            if adjacency in self.supported():
                assert account.supports(e)
                account.require_supported()
                continue
            assert not account.supports(e)
            for call in (
                account.require_supported,
                lambda e=e: backends.epsilons(e, 1e-5, self.name, [10]),
                lambda a=adjacency: backends.require_supported(self.name, a),
                lambda a=adjacency: numerical_chain(self.name, a),
            ):
                with pytest.raises(UnsupportedAccountingError) as info:
                    call()
                assert info.value.exit_code == 2 and adjacency.value in str(info.value)
        for e in self.unsupported:
            assert not self.account(e.adjacency.value).supports(e)
            with pytest.raises(UnsupportedAccountingError):
                backends.epsilons(e, 1e-5, self.name, [e.steps])

    def test_checked_curve_uses_its_chain_and_is_floored_by_rdp(self):
        q, sigma, steps = self.monotone
        chain = numerical_chain(self.name, "add_remove")
        assert all(registry.get(n).name in registry.names() for n in chain)
        e = event(q, sigma, max(steps))
        if chain and all(out_of_range(n, e, 1e-5, Tolerance()) is not None for n in chain):
            pytest.skip("every accountant of the chain is out of range at this case")
        curve = checked_curve(e, 1e-5, chain, list(steps), Tolerance())
        floor = backends.rdp_epsilons(e, 1e-5, list(steps))
        assert curve.accountant in (*chain, FLOOR)
        assert all(v <= r for v, r in zip(curve.epsilons, floor, strict=True))
        assert list(curve.epsilons) == sorted(curve.epsilons)
