"""Attacks on the accountant registry (dplora.accounting): published ε values, unknown accountant names (in a call
and in a contract), and the tuning trials' composition."""

from __future__ import annotations

import pytest
from support.row_contract import contract_raw
from tiny import save_tiny_model

from dplora.accounting import epsilon
from dplora.accounting import registry as acc_registry
from dplora.contract.loader import parse_contract
from dplora.errors import BadInputError

PUBLISHED = [  # (q, σ, T, δ, accountant, ε) from NOTES.md / the package docstring
    (0.01, 1.0, 300, 1e-5, "rdp", 1.451),
    (0.01, 1.0, 600, 1e-5, "rdp", 1.748),
    (0.01, 1.0, 300, 1e-5, "prv", 1.078),
    (0.01, 1.0, 600, 1e-5, "prv", 1.449),
]


@pytest.mark.parametrize("q,sigma,T,delta,acc,eps", PUBLISHED)
def test_accountants_give_published_numbers(q, sigma, T, delta, acc, eps):
    got = epsilon(sample_rate=q, noise_multiplier=sigma, steps=T, delta=delta, accountant=acc)
    assert round(got, 3) == pytest.approx(eps, abs=0.0015)


@pytest.mark.parametrize("name", ["gdp", "RDP", "prv ", "", "opacus", None])
def test_unknown_accountant_name_raises(name):
    with pytest.raises((BadInputError, ValueError, KeyError)):
        epsilon(sample_rate=0.01, noise_multiplier=1.0, steps=10, delta=1e-5, accountant=name)
    with pytest.raises((BadInputError, ValueError, KeyError)):
        acc_registry.get(name)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.mark.parametrize("name", ["gdp", "RDP", "opacus"])
def test_unknown_accountant_in_contract_is_bad_input(tmp_path, model_dir, name):
    with pytest.raises(BadInputError):
        parse_contract(contract_raw(tmp_path, model_dir, privacy={"accountant": name}))
