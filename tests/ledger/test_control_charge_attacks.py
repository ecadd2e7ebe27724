"""Attack A8 on the ledger: a control run (``privacy.enabled: false``) is charged ε = ∞ on a population (only with
``--non-private``) and nothing without one, now that ``is_control`` takes the privacy section
(dplora.ledger.charge.RunCharge)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from support.unit_key_attacks import unit_contract, write_csv

from dplora.errors import PlanRefusedError


def _plan():
    from dplora.accounting.events import Accountant, Adjacency

    return SimpleNamespace(
        epsilon=float("inf"), delta=1e-5, accountant=Accountant.PRV, adjacency=Adjacency.ADD_REMOVE, steps=5,
        to_dict=lambda: {},
    )  # fmt: skip


def test_a8_control_runs_are_charged_infinity_on_a_population_and_nothing_without(tmp_path, monkeypatch):
    from dplora.ledger.charge import RunCharge
    from dplora.ledger.store import Ledger
    from dplora.plan.resolve import is_control

    path = write_csv(tmp_path / "d.csv", "user_id,message,reply", ["u1,q1,a1"])
    dp = unit_contract(tmp_path, path)
    ctrl = unit_contract(tmp_path, path, privacy={"enabled": False})
    on_pop = unit_contract(tmp_path, path, privacy={"enabled": False, "population": "tickets-eu"})
    assert is_control(ctrl.privacy) and not is_control(dp.privacy)

    def charge(contract, **options):
        config = SimpleNamespace(
            plan=_plan(), private=contract.privacy.enabled, population=contract.privacy.population or None
        )
        output_dir = contract.training.output_dir
        return RunCharge(
            contract.privacy, config, output_dir=output_dir, ledger_path=tmp_path / "ledger.sqlite3", **options
        )

    # a control without population: no ledger, no charge
    c = charge(ctrl)
    assert c.open(None) is None
    c.reserve("run-ctrl", resumed=False, checkpoint_dir=tmp_path)
    assert c.ledger is None and not (tmp_path / "ledger.sqlite3").exists()
    # on a population: refused without --non-private, charged ε = ∞ with it
    Ledger(tmp_path / "ledger.sqlite3", create=True).close()
    with pytest.raises(PlanRefusedError, match="non-private"):
        charge(on_pop).open(None)
    c = charge(on_pop, non_private=True)
    c.open(None)
    c.reserve("run-ctrl", resumed=False, checkpoint_dir=tmp_path)
    row = c.ledger.charge("run-ctrl")
    assert row.population == "tickets-eu" and str(row.epsilon) == "Infinity" and row.status == "pending"
    c.ledger.close()
    # a DP run without population is charged as an unassigned run (never skipped like a control)
    from dplora.run.config import RunConfig

    def charged(contract):
        return RunConfig.charged.fget(
            SimpleNamespace(population=contract.privacy.population, private=contract.privacy.enabled)
        )

    assert charged(dp) and not charged(ctrl) and charged(on_pop)
