"""Issue 46 item 1 in the release: the record's attack ceiling, its words on the card, and verify's recomputation.

The reference is F7 row 2 (../shared/cases/README.md: q 32/4214, σ 0.417, T 12 → TPR 0.0089 / 0.0306 / 0.1411).
"""

from __future__ import annotations

import copy

import pytest

from dplora.accounting.ceiling import ceiling_entry
from dplora.accounting.events import DpSgdEvent
from dplora.errors import VerificationError
from dplora.release import envelope as rel
from dplora.release import keys as release_keys
from dplora.release.card import ceiling_line
from dplora.release.verify import verify_release

EVENT = DpSgdEvent(sample_rate=32 / 4214, noise_multiplier=0.417, steps=12)


@pytest.fixture(scope="module")
def entry():
    return ceiling_entry(EVENT)


@pytest.fixture()
def keys(tmp_path):
    priv, pub = release_keys.generate_keypair(tmp_path / "keys" / "signing.pem")
    return release_keys.load_private_key(priv), release_keys.load_public_key(pub)


def _release(tmp_path, private_key, record):
    out = tmp_path / "run"
    (out / "adapter").mkdir(parents=True, exist_ok=True)
    (out / "adapter" / "adapter_model.safetensors").write_bytes(b"w" * 64)
    files = [out / "adapter" / "adapter_model.safetensors"]
    return rel.write_release(output_dir=out, record=record, artifact_files=files, private_key=private_key)


def _record(entry=None):
    record = {"mechanism": {**EVENT.to_dict(), "max_grad_norm": 1.0}, "privacy": {"protected_unit": "user"}}
    if entry is not None:
        record["attack_ceiling"] = copy.deepcopy(entry)
    return record


def test_entry_holds_f7_values_the_method_and_the_version(entry):
    at = entry["true_positive_rate_at"]
    assert at == pytest.approx({"0.1%": 0.0089, "1%": 0.0306, "10%": 0.1411}, abs=0.002)
    assert "PLD" in entry["method"] and "min over ε" in entry["method"]
    assert entry["accountant_version"].startswith("dp-accounting ")
    assert "this release alone" in entry["scope"]


def test_verify_recomputes_the_recorded_ceiling(tmp_path, keys, entry):
    path = _release(tmp_path, keys[0], _record(entry))
    result = verify_release(path, keys[1])
    assert result.ceiling_recorded
    assert result.attack_ceiling == entry


def test_verify_fails_on_a_ceiling_that_is_not_the_mechanisms(tmp_path, keys, entry):
    bad = copy.deepcopy(entry)
    bad["true_positive_rate_at"]["1%"] = 0.0206  # signed, but not what q, σ, T give
    path = _release(tmp_path, keys[0], _record(bad))
    with pytest.raises(VerificationError, match=r"attack ceiling is not its mechanism's \(TPR at 1%"):
        verify_release(path, keys[1])
    other = _record(entry)
    other["mechanism"]["noise_multiplier"] = 0.6  # the mechanism changed, the ceiling did not
    path = _release(tmp_path, keys[0], other)
    with pytest.raises(VerificationError, match="attack ceiling"):
        verify_release(path, keys[1])


def test_an_older_record_without_a_ceiling_verifies_and_gets_one_recomputed(tmp_path, keys, entry):
    result = verify_release(_release(tmp_path, keys[0], _record()), keys[1])
    assert not result.ceiling_recorded and result.attack_ceiling == entry


def test_card_states_it_in_plain_words(entry):
    line = ceiling_line(_record(entry))
    assert "no test of whether one customer's records were used can exceed 3.1 % true positives at 1 % false" in line
    assert "this holds for this release alone" in line
    assert ceiling_line(_record()) == ""


def _attached(q: float, sigma: float, steps: int, audit_sigma: float) -> dict:
    from dplora.audit.attach import composed_claim

    record = {
        "mechanism": {
            **DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps).to_dict(),
            "max_grad_norm": 1.0,
        },
        "privacy": {"protected_unit": "user", "adjacency": "add_remove"},
        "accounting": {
            "epsilon_spent": 3.0,
            "delta": 1e-5,
            "sample_rate": q,
            "noise_multiplier": sigma,
            "steps_done": steps,
            "accountant": "rdp",
        },
        "attack_ceiling": ceiling_entry(DpSgdEvent(sample_rate=q, noise_multiplier=sigma, steps=steps)),
    }
    section = {
        "data": {"source": "private"},
        "claimed_epsilon": 3.0,
        "mechanism": {
            "delta": 1e-5,
            "sample_rate": q,
            "noise_multiplier": audit_sigma,
            "steps": steps,
            "accountant": "rdp",
        },
    }
    return {**record, "audit": {**section, "composed": composed_claim(record, section)}}


def test_attached_private_audit_ceiling_is_both_runs_together_and_verify_recomputes_it():
    """q = 1, T 4: release σ 2 (μ 1) + audit σ 1 (μ 2) is μ = √5 exactly (μ² adds: Dong, Roth & Su 2022, Cor.
    3.3): TPR at 1 % = Φ(Φ⁻¹(0.01) + √5) = 0.4640; the card states it as this release and its audit together."""
    from statistics import NormalDist

    from dplora.release.verify import check_attack_ceiling

    attached = _attached(1.0, 2.0, 4, 1.0)
    want = NormalDist().cdf(NormalDist().inv_cdf(0.01) + 5**0.5)
    entry = attached["audit"]["composed"]["attack_ceiling"]
    assert entry["true_positive_rate_at"]["1%"] == pytest.approx(want, abs=1e-6)
    assert want == pytest.approx(0.4640, abs=1e-4)
    recomputed, recorded = check_attack_ceiling(attached)
    assert recorded and recomputed["true_positive_rate_at"] == entry["true_positive_rate_at"]
    card = ceiling_line(attached)
    assert "46.5 % true positives at 1 %" in card and "its attached audit run together" in card
    tampered = copy.deepcopy(attached)
    tampered["audit"]["composed"]["attack_ceiling"]["true_positive_rate_at"]["1%"] = 0.05
    with pytest.raises(VerificationError, match="composed attack ceiling"):
        check_attack_ceiling(tampered)


def test_attached_audit_on_surrogate_data_keeps_the_release_ceiling():
    from dplora.release.verify import check_attack_ceiling

    attached = _attached(1.0, 2.0, 4, 2.0)
    attached["audit"] = {**attached["audit"], "data": {"source": "surrogate"}}
    del attached["audit"]["composed"]
    recomputed, _ = check_attack_ceiling(attached)
    assert recomputed["true_positive_rate_at"] == attached["attack_ceiling"]["true_positive_rate_at"]
    assert "this release alone" in ceiling_line(attached)
