"""Pinned accountant numbers and calibration guarantees (cases A1–A10 of ../shared/cases/README.md).

Reference values: Opacus 1.6.0 (RDP, PRV), dp-accounting 0.6.0 (PLD); tolerance ±0.02 in ε unless stated.
"""

from __future__ import annotations

import json
import math
import os
import time

import pytest
from support.accounting import (
    GRID,
    PINNED,
    SLOW_A1_GRID,
    SLOW_PINNED,
    TOL,
    broken_prv,
    calib,
    check_grid_point,
    eps,
    observed,
)

import dplora.accounting.backends as backends
from dplora.accounting.backends import RDP_ORDERS, AccountingNumericalError
from dplora.accounting.cache import cache_dir
from dplora.accounting.events import Accountant
from dplora.errors import BadInputError, PlanRefusedError, UnsupportedAccountingError

pytestmark = pytest.mark.usefixtures("fresh_cache")  # a calibration cache of each test's own


@pytest.mark.parametrize("case", [case for case in PINNED if case not in SLOW_PINNED])
def test_pinned_epsilon(case):
    assert observed(case) == pytest.approx(PINNED[case][-1], abs=TOL)


def test_relations_between_observed_values():
    """PLD ≤ RDP (STYLE.md: 3.90 vs 4.25); micro-batch q understates ε (A8); replace-one costs more (A10)."""
    assert observed("STYLE PLD") < observed("STYLE RDP")
    assert observed("A4 MNIST PLD") < observed("A4 MNIST RDP")
    assert observed("A8 micro-batch q (wrong) PLD") < 0.2 * observed("A8 PLD")
    assert observed("A10 PLD replace-one") > observed("A10 PLD add/remove") + 0.9
    assert observed("A10 MNIST PLD replace-one") > observed("A4 MNIST PLD") + 1.5


def test_accountants_do_not_warn():
    """Opacus warns 'Optimal order is the largest/smallest alpha' (RDP, and PRV through its domain bound) and
    PRV takes log(0) at q = 1; none of it changes ε, and it must not add lines to the CLI's stderr."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eps("rdp", 1.0, 1.0, 10)  # optimum at the smallest order
        eps("rdp", 0.01, 100.0, 1000)  # optimum at the largest order
        eps("prv", 0.01, 10.8, 1000)  # PRV's RDP domain bound at the largest order
        assert eps("prv", 1.0, 1.0, 10) == pytest.approx(17.86, abs=TOL)  # q = 1 (PLD: 17.857)


def test_a1_anchor_target_1():
    sigma = calib("rdp", 1.0, 0.01, 1000)
    assert 1.50 <= sigma <= 1.523 * 1.01
    assert eps("rdp", 0.01, sigma, 1000) <= 1.0


@pytest.mark.parametrize(("target", "q", "steps"), [point for point in GRID if point not in SLOW_A1_GRID])
def test_a1_grid_rdp_never_overshoots(target, q, steps):
    check_grid_point(target, q, steps)


def test_a2_rdp_refuses_below_its_limit():
    with pytest.raises(PlanRefusedError) as info:
        calib("rdp", 0.1, 0.01, 1000)
    msg = str(info.value)
    assert "0.1" in msg and "pld" in msg and "prv" in msg
    assert info.value.exit_code == 2


def test_a3_prv_short_run():
    try:
        value = eps("prv", 0.2, 1.0, 10)
    except AccountingNumericalError:
        pytest.skip("this Opacus PRV fails numerically here; the plan falls back to PLD (tested below)")
    assert value == pytest.approx(4.98, abs=TOL)


def test_prv_numerical_error_is_named(monkeypatch):
    monkeypatch.setattr(backends, "prv_epsilon", broken_prv)
    with pytest.raises(AccountingNumericalError):
        eps("prv", 0.2, 1.0, 10)


def test_a5_no_gdp_accountant():
    """ "gdp" through the API is the project's bad-input error (exit code 2), naming what is offered."""
    assert {a.value for a in Accountant} == {"prv", "rdp", "pld"}
    for call in (lambda: eps("gdp", 0.2, 1.0, 10), lambda: calib("gdp", 3.0, 0.2, 10)):
        with pytest.raises(BadInputError) as info:
            call()
        assert "gdp" in str(info.value) and "'prv'" in str(info.value) and info.value.exit_code == 2
    with pytest.raises(BadInputError, match="adjacency"):
        eps("rdp", 0.2, 1.0, 10, adjacency="replace_special")


@pytest.mark.parametrize("delta", [0, 0.0, 1, 1.0, 1.5, -1, -1e-5, math.nan, math.inf])
@pytest.mark.parametrize("accountant", ["rdp", "prv", "pld"])
def test_a6_bad_delta(delta, accountant):
    with pytest.raises(BadInputError):
        eps(accountant, 0.1, 1.0, 10, delta)
    with pytest.raises(BadInputError):
        calib(accountant, 3.0, 0.1, 10, delta)


def test_a6_never_negative():
    import warnings

    # Opacus's own RDP conversion gives about −0.53 here
    from dplora.accounting.backends import opacus_rdp

    rdp = opacus_rdp()
    one = rdp.compute_rdp(q=0.1, noise_multiplier=1.0, steps=10, orders=list(RDP_ORDERS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw, _ = rdp.get_privacy_spent(orders=list(RDP_ORDERS), rdp=one, delta=0.5)
    assert raw == pytest.approx(-0.53, abs=TOL)
    assert eps("rdp", 0.1, 1.0, 10, 0.5) >= 0.0


@pytest.mark.parametrize("accountant", ["rdp", "prv", "pld"])
def test_a6_zero_steps_and_zero_noise(accountant):
    assert eps(accountant, 0.1, 1.0, 0) == 0.0
    assert eps(accountant, 0.1, 0.0, 0) == 0.0
    assert eps(accountant, 0.1, 0.0, 10) == math.inf


@pytest.mark.parametrize(
    "kwargs",
    [
        {"q": 0.0},
        {"q": -0.1},
        {"q": 1.5},
        {"q": math.nan},
        {"sigma": -1.0},
        {"sigma": math.nan},
        {"sigma": math.inf},
        {"steps": -1},
        {"steps": 10.5},
        {"steps": True},
    ],
)
def test_bad_mechanism_arguments(kwargs):
    args = {"q": 0.1, "sigma": 1.0, "steps": 10} | kwargs
    with pytest.raises(BadInputError):
        eps("rdp", args["q"], args["sigma"], args["steps"])


@pytest.mark.parametrize("target", [0, -1.0, math.nan, math.inf])
def test_bad_target_epsilon(target):
    with pytest.raises(BadInputError):
        calib("rdp", target, 0.01, 100)


def test_zero_steps_calibration_is_not_an_error():
    sigma = calib("rdp", 1.0, 0.01, 0)
    assert sigma > 0


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_a10_replace_one_needs_pld(accountant):
    with pytest.raises(UnsupportedAccountingError) as info:
        eps(accountant, 0.01, 1.0, 1000, adjacency="replace_one")
    msg = str(info.value)
    assert "add_remove" in msg and "pld" in msg and info.value.exit_code == 2
    with pytest.raises(UnsupportedAccountingError):
        calib(accountant, 3.0, 0.01, 1000, adjacency="replace_one")


def test_cache_second_call_is_fast_and_equal():
    t0 = time.perf_counter()
    first = calib("rdp", 3.0, 0.01, 1000)
    cold = time.perf_counter() - t0
    assert (cache_dir() / "calibration.json").is_file()
    t0 = time.perf_counter()
    second = calib("rdp", 3.0, 0.01, 1000)
    warm = time.perf_counter() - t0
    assert second == first
    assert warm < 0.05 + cold / 3


def test_cache_is_keyed_by_every_argument():
    # q = 1 (no subsampling) keeps each RDP evaluation cheap
    base = calib("rdp", 3.0, 1.0, 10)
    assert calib("rdp", 3.0, 1.0, 20) > base
    assert calib("rdp", 2.0, 1.0, 10) > base
    assert calib("rdp", 3.0, 1.0, 10, delta=1e-7) > base
    assert calib("rdp", 3.0, 0.01, 10) < base
    assert calib("rdp", 3.0, 1.0, 10) == base


DAMAGES = {
    "truncated": lambda data: "{not json",
    "empty": lambda data: "",
    "list": lambda data: json.dumps([1, 2, 3]),
    "str-entry": lambda data: json.dumps({k: "junk" for k in data}),
    "null-entry": lambda data: json.dumps({k: None for k in data}),
    "str-sigma": lambda data: json.dumps({k: {"noise_multiplier": "x", "epsilon": 0.0} for k in data}),
    "negative-sigma": lambda data: json.dumps({k: {"noise_multiplier": -5.0, "epsilon": 0.0} for k in data}),
    "no-sigma": lambda data: json.dumps({k: {"epsilon": 1.0} for k in data}),
    "eps-above-target": lambda data: json.dumps({k: {"noise_multiplier": 0.1, "epsilon": 99.0} for k in data}),
    "sigma-edited-up": lambda data: json.dumps({k: {"noise_multiplier": 50.0, "epsilon": 0.0} for k in data}),
    "nested-too-deep": lambda data: "[" * 200_000,  # RecursionError in the JSON parser: damage like any other
}


def test_corrupted_cache_is_ignored():
    sigma = calib("rdp", 3.0, 1.0, 10)
    path = cache_dir() / "calibration.json"
    good = json.loads(path.read_text())
    for name, damage in DAMAGES.items():
        path.write_text(damage(good))
        assert calib("rdp", 3.0, 1.0, 10) == pytest.approx(sigma, rel=1e-9), name
        assert json.loads(path.read_text()) == good, name  # rewritten with the good entry


def test_a_fifo_in_place_of_the_cache_file_never_blocks(tmp_path, monkeypatch):
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    os.mkfifo(tmp_path / "cache" / "calibration.json")  # a read of it would wait for a writer forever
    sigma = calib("rdp", 3.0, 1.0, 10)
    assert sigma > 0 and (tmp_path / "cache" / "calibration.json").is_file()  # replaced by a regular file


def test_unwritable_cache_is_not_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DPLORA_CACHE_DIR", str(blocker / "cache"))
    assert calib("rdp", 3.0, 0.01, 1000) > 0
