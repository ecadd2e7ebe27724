"""The built-in accountants against the inherited contract, and the registry's refusals (issue 44, item 3).

Reference values are the pinned ones of ``test_accounting.py`` and ``test_accounting_exact.py`` (cases A4, A7 and
A10 of ../shared/cases/README.md, and ../shared/NOTES.md; Opacus 1.6.0, dp-accounting 0.6.0), ±0.02 in ε.
"""

from __future__ import annotations

import pytest
from accountant_contract import AccountantContract

from dplora.accounting import backends, composition, cost, registry
from dplora.accounting.checked import numerical_chain
from dplora.accounting.events import Accountant, DpSgdEvent
from dplora.errors import BadInputError

MNIST_Q = 256 / 60000


pytestmark = pytest.mark.usefixtures("fresh_cache")  # a calibration cache of each test's own


class TestRDP(AccountantContract):
    name = "rdp"
    references = (
        (0.01, 1.0, 300, 1e-5, "add_remove", 1.451, 0.02),  # NOTES
        (0.01, 1.0, 600, 1e-5, "add_remove", 1.748, 0.02),  # NOTES
        (MNIST_Q, 1.1, 14062, 1e-5, "add_remove", 2.597, 0.02),  # A4, MNIST (Abadi et al. 2016)
        (1.0, 1.0, 10, 1e-5, "add_remove", 19.05, 0.02),  # A7, q = 1
    )


class TestPRV(AccountantContract):
    name = "prv"
    references = (
        (0.01, 1.0, 300, 1e-5, "add_remove", 1.078, 0.02),  # NOTES
        (0.01, 1.0, 600, 1e-5, "add_remove", 1.449, 0.02),  # NOTES
    )
    monotone = (0.01, 1.0, (100, 300, 600))  # PRV fails numerically on very short, loose runs (case A3)


class TestPLD(AccountantContract):
    name = "pld"
    references = (
        (0.01, 1.0, 1000, 1e-5, "add_remove", 1.83, 0.02),  # A10
        (0.01, 1.0, 1000, 1e-5, "replace_one", 2.84, 0.02),  # A10
        (1.0, 1.0, 10, 1e-5, "add_remove", 17.857, 0.02),  # A7, q = 1 (the analytic Gaussian)
    )
    monotone = (0.05, 2.0, (2, 10, 50))  # about 1.5 s per relation (A3's q = 0.2 takes 5-8 s: test_accounting.py)


def test_built_ins_are_the_contract_accountants_in_its_order():
    assert registry.names()[:3] == tuple(a.value for a in Accountant)
    assert [registry.get(a).package for a in Accountant] == ["opacus", "opacus", "dp-accounting"]
    assert [registry.get(a).rtol for a in Accountant] == [4e-3, 1e-4, 4e-3]  # the calibration tolerances


def test_chains_are_those_of_the_checked_rule():
    """PRV → PLD → RDP, PLD → RDP, RDP alone under add/remove; PLD alone under replace-one (checked.py)."""
    assert numerical_chain("prv", "add_remove") == (Accountant.PRV, Accountant.PLD)
    assert numerical_chain("pld", "add_remove") == (Accountant.PLD,)
    assert numerical_chain("rdp", "add_remove") == ()
    assert numerical_chain("pld", "replace_one") == (Accountant.PLD,)


@pytest.mark.parametrize("name", ["gdp", "PRV", "", "opacus"])
def test_unknown_name_raises_everywhere_it_used_to_default(name):
    """An unknown name is refused (exit code 2, naming those offered) where it was computed by PLD
    (``backends.epsilons``), labelled "opacus" (``accountant_version``) or given an empty chain
    (``numerical_chain``)."""
    e = DpSgdEvent(sample_rate=0.01, noise_multiplier=1.0, steps=10)
    for call in (
        lambda: registry.get(name),
        lambda: registry.make(name, "add_remove"),
        lambda: backends.epsilons(e, 1e-5, name, [10]),
        lambda: backends.accountant_version(name),
        lambda: backends.require_supported(name, "add_remove"),
        lambda: numerical_chain(name, "add_remove"),
        lambda: cost.out_of_range(name, e, 1e-5, cost.Tolerance()),
    ):
        with pytest.raises(BadInputError) as info:
            call()
        message = str(info.value)
        assert info.value.exit_code == 2 and f"accountant={name!r} is not offered" in message
        assert all(repr(a.value) in message for a in Accountant)


def test_register_refuses_a_taken_name_and_a_non_accountant():
    class Other(registry.PrivacyAccountant):
        name = "rdp"
        package = "opacus"

        def epsilons(self, event, delta, steps, tolerance=None):
            return [0.0 for _ in steps]

    with pytest.raises(ValueError, match="already registered"):
        registry.register(Other)
    with pytest.raises(TypeError):
        registry.register(object)
    assert registry.get("rdp") is not Other


def test_sweep_composition_order_and_methods_unchanged():
    """The composers of a sweep: RDP under add/remove always, PRV or PLD when every trial used it (composition)."""
    assert composition.composers({"prv"}, "add_remove") == ["rdp", "prv"]
    assert composition.composers({"pld"}, "add_remove") == ["rdp", "pld"]
    assert composition.composers({"prv", "pld"}, "add_remove") == ["rdp"]
    assert composition.composers({"rdp"}, "add_remove") == ["rdp"]
    assert composition.composers({"pld"}, "replace_one") == ["pld"]
    assert composition.composers({"prv"}, "replace_one") == []
    assert [registry.get(n).composition_method for n in ("rdp", "prv", "pld")] == [
        composition.RDP,
        composition.PRV,
        composition.PLD,
    ]
