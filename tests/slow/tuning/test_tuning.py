"""The slow tier of tests/tuning/test_tuning.py, whose docstring describes the module."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import contract_dict, write_contract
from support.tuning import auto_sweep_contract
from typer.testing import CliRunner

from dplora.cli.app import app

runner = CliRunner()


def test_clip_guide_cli_never_reads_the_contract_data(tmp_path, tiny_model_dir, tickets_csv):
    """Without --public it measures demo tickets and says so; --public naming the training file is refused."""
    cfg = write_contract(tmp_path / "c.yaml", contract_dict(tiny_model_dir, tmp_path / "absent.csv", tmp_path / "o"))
    result = runner.invoke(app, ["clip-guide", str(cfg), "--sample", "8", "--threads", "1", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["units"] == 8 and "demo generator" in doc["sample"]
    assert doc["suggested_max_grad_norm"] == pytest.approx(doc["quantiles"]["p50"])
    assert "grad A = 0" in doc["note"]
    declared = runner.invoke(app, ["clip-guide", str(cfg), "--public", str(tickets_csv), "--sample", "5", "--json"])
    assert declared.exit_code == 0, declared.output
    assert json.loads(declared.stdout)["sample"] == f"--public {tickets_csv.name} (declared public by the user)"
    private = write_contract(tmp_path / "p.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp_path / "o"))
    refused = runner.invoke(app, ["clip-guide", str(private), "--public", str(tickets_csv)])
    assert refused.exit_code == 2 and "data.path (private training data)" in refused.output


def _payload(folder: Path) -> dict:
    return json.loads(base64.b64decode(json.loads((folder / "release.dsse.json").read_text())["payload"]))


def _sweep_contract(tmp_path, tiny_model_dir, tickets_csv, db):
    from dplora.ledger.store import Ledger

    Ledger(db).set_cap("tickets", epsilon_max="100", delta_max="1e-3", protected_unit="row", adjacency="add_remove")
    raw = contract_dict(
        tiny_model_dir, tickets_csv, tmp_path / "unused", privacy={"population": "tickets"}, training={"steps": 2}
    )
    return write_contract(tmp_path / "sweep.yaml", raw)


def test_sweep_charges_three_trials_and_states_their_composed_epsilon(
    tmp_path, tiny_model_dir, tickets_csv, signing_key
):
    """Three trials: three tuning charges; the one release states all three trials' (ε, δ), their basic sum and
    the RDP composition recomputed here with Opacus, and the smaller as the total; the other trials are gone."""
    from opacus.accountants import RDPAccountant

    from dplora.ledger.store import Ledger

    db = tmp_path / "ledger.sqlite3"
    cfg = _sweep_contract(tmp_path, tiny_model_dir, tickets_csv, db)
    out = tmp_path / "sweep"
    args = ["sweep", str(cfg), "privacy.target_epsilon=2,4,8", "--out", str(out), "--ledger", str(db)]
    args += ["--signing-key", str(signing_key[0]), "--threads", "1", "--no-progress", "--eval-tickets", "16", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    charges = Ledger(db).charges("tickets")
    assert (
        len(charges) == 3 and {c.purpose for c in charges} == {"tuning"} and {c.status for c in charges} == {"settled"}
    )
    release_dir = Path(json.loads(result.stdout)["release"])
    kept = sorted(p.name for p in out.iterdir() if p.is_dir())  # the others' adapters and private logs are deleted
    assert kept == [release_dir.name, f"{release_dir.name}.private"]
    predicate = _payload(release_dir)["predicate"]
    tuning = predicate["tuning"]
    assert "total over all trials" in predicate["accounting"]["composition"]
    assert tuning["trials"] == 3 and tuning["trial_run_ids"] == [c.run_id for c in charges]
    eps = [t["epsilon"] for t in tuning["per_trial"]]
    assert eps == pytest.approx([float(c.epsilon) for c in charges], rel=1e-12)  # what the ledger charged
    assert eps[0] < eps[1] < eps[2] <= 8
    contract = yaml.safe_load(cfg.read_text())["training"]  # every trial runs the contract's own B and rate
    assert [(t["expected_batch_size"], t["lr"]) for t in tuning["per_trial"]] == [
        (contract["expected_batch_size"], contract.get("lr", 0.002))
    ] * 3
    basic = sum(eps)  # Dwork & Roth 2014, Thm 3.16: Σε at Σδ
    assert tuning["compositions"]["basic"]["epsilon"] == pytest.approx(basic, rel=1e-12)
    assert tuning["total_delta"] == pytest.approx(3e-5, rel=1e-12)
    accountant = RDPAccountant()
    accountant.history = [(t["noise_multiplier"], t["sample_rate"], t["steps"]) for t in tuning["per_trial"]]
    rdp = accountant.get_epsilon(delta=3e-5)
    assert tuning["compositions"]["rdp"]["epsilon"] == pytest.approx(rdp, rel=1e-9)
    assert tuning["total_epsilon"] == pytest.approx(min(basic, rdp), rel=1e-9)
    assert tuning["covered"] is True and tuning["selection"]["eval_set"] == "public"
    losses = [t["held_out_loss"] for t in tuning["per_trial"]]
    assert tuning["selection"]["chosen_trial"] == 1 + losses.index(min(losses))
    assert _payload(release_dir)["predicate"]["run_id"] == tuning["selection"]["chosen_run_id"]
    assert [r["run_id"] for r in Ledger(db).releases()] == [tuning["selection"]["chosen_run_id"]]
    card = (release_dir / "adapter" / "README.md").read_text()
    assert "Tuning: chosen among 3 trials (`dplora sweep`), each charged; all trials together spend ε = " in card
    assert f"ε = {tuning['total_epsilon']:.4f}, δ = 3e-05" in card
    # the ceiling of every trial composed, in the record, the card, verify and verify --json
    _check_sweep_ceiling(tuning["attack_ceiling"], tuning["per_trial"], "add_remove")
    assert predicate["attack_ceiling"]["holds_for"].startswith("this trial alone")
    holds = "this holds for the chosen trial and the 3 trials it was chosen from together"
    assert holds in card and "NOT COVERED" not in tuning["attack_ceiling"]["holds_for"]
    # the headline is the total of what the release depends on; the chosen trial's own ε a line below
    acc = predicate["accounting"]
    headline = next(ln for ln in card.splitlines() if "-differential privacy for one" in ln)
    assert headline.startswith(f"(ε = {tuning['total_epsilon']:.4f}, δ = 3e-05)")
    assert f"the chosen trial alone, without the other 2 trial(s): ε = {acc['epsilon_spent']:.4f}" in card
    check = runner.invoke(app, ["verify", str(release_dir), "--public-key", str(signing_key[1])])
    assert check.exit_code == 0, check.output
    assert f"tuning: 3 trials, total ε={tuning['total_epsilon']:.4f}" in check.stdout and "covered" in check.stdout
    assert holds in check.stdout and "recomputed from every sweep trial's q, σ, T" in check.stdout
    as_json = runner.invoke(app, ["verify", str(release_dir), "--public-key", str(signing_key[1]), "--json"])
    claimed = json.loads(as_json.stdout)["claims"]["attack_ceiling"]
    assert claimed["true_positive_rate_at"] == tuning["attack_ceiling"]["true_positive_rate_at"]


def test_sweep_chosen_on_private_data_is_marked_not_covered(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """--eval-private: the record says NOT COVERED and holds no private losses; verify prints it."""
    db = tmp_path / "ledger.sqlite3"
    cfg = _sweep_contract(tmp_path, tiny_model_dir, tickets_csv, db)
    out = tmp_path / "sweep"
    args = ["sweep", str(cfg), "training.lr=0.01,0.02", "training.steps=1", "--out", str(out), "--ledger", str(db)]
    args += ["--signing-key", str(signing_key[0]), "--threads", "1", "--no-progress"]
    args += ["--eval-private", str(tickets_csv)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    release_dir = Path(result.stdout.strip().removeprefix("release: "))
    tuning = _payload(release_dir)["predicate"]["tuning"]
    assert tuning["covered"] is False and tuning["statement"].startswith("NOT COVERED")
    assert tuning["selection"]["eval_set"] == "private" and "evaluation" not in tuning["selection"]
    assert all("held_out_loss" not in t for t in tuning["per_trial"])
    assert "not_covered_by_dp" not in json.loads((out / "sweep.json").read_text())  # public, beside the release
    private = json.loads((out.with_name(out.name + ".private") / "sweep.json").read_text())
    assert len(private["not_covered_by_dp"]["held_out_loss"]) == tuning["trials"]
    check = runner.invoke(app, ["verify", str(release_dir), "--public-key", str(signing_key[1])])
    assert check.exit_code == 0 and "NOT COVERED: chosen on private data" in check.stdout
    # the ceiling bounds every trial composed, and says the private choice is not covered
    _check_sweep_ceiling(tuning["attack_ceiling"], tuning["per_trial"], "add_remove")
    words = "the chosen trial and the 2 trials it was chosen from together, but NOT for the choice itself"
    assert words in check.stdout and words in (release_dir / "adapter" / "README.md").read_text()


@pytest.mark.parametrize(
    ("extra", "cap", "needle"),
    [
        (["privacy.population=other,tickets"], "100", "cannot vary in a sweep"),
        (["training.output_dir=x"], "100", "set by the sweep"),
        # three trials of ε 8 (RDP) compose by PLD to 7.69 at δ 3e-5 (one: 6.64): a cap of 7.5 holds one, not three
        (["privacy.target_epsilon=8,8,8"], "7.5", "the sweep's 3 trials together"),
    ],
)
def test_sweep_refuses_before_any_trial(tmp_path, tiny_model_dir, tickets_csv, signing_key, extra, cap, needle):
    """Bad grids and a cap that cannot hold every trial are refused (exit 2): nothing written, nothing charged."""
    from dplora.ledger.store import Ledger

    db = tmp_path / "ledger.sqlite3"
    cfg = _sweep_contract(tmp_path, tiny_model_dir, tickets_csv, db)
    Ledger(db).set_cap("tickets", epsilon_max=cap, delta_max="1e-3", protected_unit="row", adjacency="add_remove")
    out = tmp_path / "sweep"
    args = ["sweep", str(cfg), *extra, "--out", str(out), "--ledger", str(db), "--signing-key", str(signing_key[0])]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and needle in result.output, result.output
    assert not out.exists() and Ledger(db).charges() == []


def test_sweep_needs_a_population(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """Without privacy.population there is no ledger to charge: refused before any trial."""
    cfg = write_contract(tmp_path / "c.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp_path / "unused"))
    out = tmp_path / "sweep"
    result = runner.invoke(app, ["sweep", str(cfg), "training.lr=0.01,0.02", "--out", str(out), "--json"])
    assert result.exit_code == 2 and "set privacy.population" in result.output
    assert json.loads(result.stdout)["exit_code"] == 2 and not out.exists()


def _np_tpr(pmf, alpha: float) -> float:
    """The Neyman–Pearson test's TPR at FPR ``alpha`` on one direction of a dp_accounting PLD: reject for the
    largest privacy losses first (randomised on the boundary atom); the infinite-loss mass is free."""
    from dp_accounting.pld import pld_pmf

    if isinstance(pmf, pld_pmf.SparsePLDPmf):
        items = sorted(pmf._loss_probs.items())
        losses = np.array([k for k, _ in items], float) * pmf._discretization
        probs = np.array([v for _, v in items], float)
    else:
        losses = (pmf._lower_loss + np.arange(len(pmf._probs))) * pmf._discretization
        probs = np.asarray(pmf._probs, float)
    order = np.argsort(-losses)
    losses, probs = losses[order], probs[order]
    fprs = probs * np.exp(-losses)  # the other distribution's mass of each atom: P·e^{-L}
    cum_fpr, cum_tpr = np.cumsum(fprs), pmf._infinity_mass + np.cumsum(probs)
    k = int(np.searchsorted(cum_fpr, alpha))
    before_fpr, before_tpr = (cum_fpr[k - 1], cum_tpr[k - 1]) if k else (0.0, pmf._infinity_mass)
    return float(before_tpr + (alpha - before_fpr) / fprs[k] * probs[k])


def _np_ceiling(trials: list[dict], adjacency: str, alpha: float) -> float:
    """An independent value: dp_accounting's PLD of the trials composed (pessimistic, interval 1e-4), read by the
    Neyman–Pearson test in both directions (remove and add), not through δ(ε)."""
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    relation = dp_accounting.NeighboringRelation
    rel = relation.ADD_OR_REMOVE_ONE if adjacency == "add_remove" else relation.REPLACE_ONE
    accountant = PLDAccountant(neighboring_relation=rel, value_discretization_interval=1e-4)
    for t in trials:
        gaussian = dp_accounting.GaussianDpEvent(t["noise_multiplier"])
        event = dp_accounting.PoissonSampledDpEvent(t["sample_rate"], gaussian)
        accountant.compose(dp_accounting.SelfComposedDpEvent(event, t["steps"]))
    pld = accountant._pld
    return max(_np_tpr(pld._pmf_remove, alpha), _np_tpr(pld._pmf_add, alpha))


def _check_sweep_ceiling(entry: dict, trials: list[dict], adjacency: str) -> None:
    """The sweep's ceiling equals the composition used for attached audits within 1e-6 and is at least the
    independent Neyman–Pearson value of the trials composed at every FPR."""
    from dplora.accounting.ceiling_compose import runs_ceiling_entry
    from dplora.accounting.events import DpSgdEvent

    assert entry["available"] is True
    composed = runs_ceiling_entry([DpSgdEvent.from_dict(t, adjacency=adjacency) for t in trials])
    for label, alpha in (("0.1%", 1e-3), ("1%", 1e-2), ("10%", 1e-1)):
        tpr = entry["true_positive_rate_at"][label]
        assert tpr == pytest.approx(composed["true_positive_rate_at"][label], abs=1e-6)
        assert tpr >= _np_ceiling(trials, adjacency, alpha) - 1e-9, label


@pytest.mark.parametrize("adjacency", ["add_remove", "replace_one"])
def test_a_sweep_states_the_ceiling_of_all_its_trials_composed(adjacency):
    """Two trials at q 0.2, σ 0.9195, T 2: the chosen trial alone allows 3.73 % TPR at 1 % FPR (add/remove), the
    two composed 5.01 %; the tuning entry states the composed one (and a mixed-σ grid's), never the trial's."""
    from types import SimpleNamespace

    from dplora.accounting.ceiling import ceiling_entry
    from dplora.accounting.events import DpSgdEvent
    from dplora.tuning.sweep import tuning_entry

    def result(sigma, run_id):
        plan = SimpleNamespace(
            delta=1e-5, accountant=SimpleNamespace(value="pld"), sample_rate=0.2, expected_batch_size=20, lr=0.002
        )
        plan.noise_multiplier = sigma
        return SimpleNamespace(plan=plan, run_id=run_id, epsilon_spent=1.0, steps_done=2)

    loss = SimpleNamespace(adapter=SimpleNamespace(loss=1.0), to_dict=dict)
    one = ceiling_entry(DpSgdEvent(sample_rate=0.2, noise_multiplier=0.9195, steps=2, adjacency=adjacency))
    for sigmas, public in (((0.9195, 0.9195), True), ((0.9195, 1.3), False)):
        results = [([f"t={k}"], result(s, f"r{k}"), loss) for k, s in enumerate(sigmas)]
        tuning = tuning_entry(results, 0, source="demo", public=public, adjacency=adjacency)
        entry = tuning["attack_ceiling"]
        _check_sweep_ceiling(entry, tuning["per_trial"], adjacency)
        assert entry["true_positive_rate_at"]["1%"] > one["true_positive_rate_at"]["1%"]
        assert entry["holds_for"].startswith("the chosen trial and the 2 trials it was chosen from together")
        assert ("NOT COVERED" in entry["holds_for"]) is not public
        if adjacency == "add_remove" and public:  # the numbers: 3.73 % stated, 5.01 % composed
            assert one["true_positive_rate_at"]["1%"] == pytest.approx(0.0373, abs=1e-4)
            assert entry["true_positive_rate_at"]["1%"] == pytest.approx(0.0501, abs=1e-4)


def test_sweep_with_auto_is_refused_by_the_composed_cap_not_by_auto(tmp_path, tiny_model_dir, tickets_csv, signing_key):
    """Two auto trials of ε ≤ 8 against a cap of 8.1: the composed-cap refusal (exit 2), nothing written or charged
    (before, planning refused ``auto`` itself)."""
    from dplora.ledger.store import Ledger

    db = tmp_path / "ledger.sqlite3"
    cfg = auto_sweep_contract(tmp_path, tiny_model_dir, tickets_csv, db, "8.1")
    out = tmp_path / "sweep"
    args = ["sweep", str(cfg), "training.lr=0.01,0.02", "--out", str(out), "--ledger", str(db)]
    result = runner.invoke(app, [*args, "--signing-key", str(signing_key[0])])
    assert result.exit_code == 2 and "the sweep's 2 trials together" in result.output, result.output
    assert not out.exists() and Ledger(db).charges() == []
