"""The noise source (dplora.mechanism.noise): ChaCha20 known answers, key sensitivity, moments, entropy width, key
hygiene."""

from __future__ import annotations

import copy
import math
import os
import pickle
import secrets
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dplora.mechanism import optimizer as dpopt
from dplora.mechanism.noise import CsprngGaussian, chacha20_keystream, privatize

# RFC 8439 §2.4.2: key 00..1f, nonce 00000000 0000004a 00000000, initial counter 1.
RFC_KEY = bytes(range(32))
RFC_NONCE = bytes.fromhex("000000000000004a00000000")
RFC_PLAINTEXT = (
    b"Ladies and Gentlemen of the class of '99: "
    b"If I could offer you only one tip for the future, sunscreen would be it."
)
RFC_CIPHERTEXT = bytes.fromhex(
    "6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0b"
    "f91b65c5524733ab8f593dabcd62b3571639d624e65152ab8f530c359f0861d8"
    "07ca0dbf500d6a6156a38e088a22b65e52bc514d16ccf806818ce91ab7793736"
    "5af90bbf74a35be6b40b8eedf2785e42874d"
)


def test_chacha20_stream_matches_rfc8439_test_vector():
    """RFC 8439 §2.4.2 ciphertext = plaintext XOR our keystream (counter 1); counter 0's first block precedes it."""
    stream = chacha20_keystream(RFC_KEY, RFC_NONCE, len(RFC_PLAINTEXT), counter=1)
    assert bytes(p ^ k for p, k in zip(RFC_PLAINTEXT, stream, strict=True)) == RFC_CIPHERTEXT
    from_zero = chacha20_keystream(RFC_KEY, RFC_NONCE, 64 + len(RFC_PLAINTEXT), counter=0)
    assert from_zero[64:] == stream
    with pytest.raises(ValueError):
        chacha20_keystream(RFC_KEY[:16], RFC_NONCE, 8)


def _reference_noise(key: bytes, draw: int, size: int, std: float) -> np.ndarray:
    """Independent numpy version of the documented recipe: stream → uint64 → 53 bits → Box–Muller → Σ4/2 → fp32."""
    stream = chacha20_keystream(key, draw.to_bytes(12, "little"), 32 * size, counter=0)
    u = np.frombuffer(stream, dtype="<u8")
    m = ((u >> np.uint64(11)) ^ np.uint64(1 << 52)).astype(np.float64).reshape(size, 2, 2)  # value, pair, word
    u1, u2 = (m[..., 0] + 1.0) * 2.0**-53, m[..., 1] * 2.0**-53
    r = np.sqrt(-2.0 * np.log(u1))
    z = r * np.cos(2 * np.pi * u2) + r * np.sin(2 * np.pi * u2)  # (size, 2): z₁ + z₂ of each pair
    return ((z[:, 0] + z[:, 1]) * (0.5 * std)).astype(np.float32)


def test_noise_is_the_documented_function_of_the_keystream():
    """Known answer end to end: draws 0 and 1 equal the numpy reference built from the RFC-checked stream."""
    gen = CsprngGaussian(key=RFC_KEY)
    for draw in range(2):
        got = gen.normal(1000, 2.5).numpy()
        np.testing.assert_allclose(got, _reference_noise(RFC_KEY, draw, 1000, 2.5), rtol=1e-6, atol=1e-6)
    assert gen.draws == 2


def test_flipping_any_key_byte_changes_every_value():
    base = CsprngGaussian(key=RFC_KEY).normal(64, 1.0)
    for i in range(32):
        for flip in (0x01, 0x80, 0xFF):
            key = bytearray(RFC_KEY)
            key[i] ^= flip
            other = CsprngGaussian(key=bytes(key)).normal(64, 1.0)
            assert bool((other != base).all()), (i, flip)


def test_a_million_draws_have_the_standard_normal_moments():
    """Mean, variance and the two-sided 3σ tail of 10⁶ draws, each within 4 standard errors (OS-entropy key)."""
    n, std = 1_000_000, 3.0
    z = CsprngGaussian().normal(n, std).double() / std
    assert z.dtype == torch.float64 and torch.isfinite(z).all()
    assert abs(float(z.mean())) < 4 / math.sqrt(n)
    assert abs(float(z.var()) - 1.0) < 4 * math.sqrt(2 / n)
    tail, p = float((z.abs() > 3).double().mean()), math.erfc(3 / math.sqrt(2))
    assert abs(tail - p) < 4 * math.sqrt(p * (1 - p) / n)
    third, fourth = float((z**3).mean()), float((z**4).mean())
    assert abs(third) < 4 * math.sqrt(15 / n) and abs(fourth - 3) < 4 * math.sqrt(96 / n)


def test_successive_draws_and_generators_differ():
    gen = CsprngGaussian(key=RFC_KEY)
    a, b = gen.normal(32, 1.0), gen.normal(32, 1.0)
    assert bool((a != b).all())  # a fresh nonce per draw
    x, y = dpopt.os_entropy_generator().normal(32, 1.0), dpopt.os_entropy_generator().normal(32, 1.0)
    assert bool((x != y).all())  # two processes' keys from os.urandom


def test_noise_depends_on_entropy_above_bit_32(monkeypatch):
    """Two noise sources whose OS entropy differs only at bit 32 must draw different noise.

    Fails on the torch-Generator version: mt19937 keeps the low 32 bits of its 63-bit seed, so seeds s and s + 2³²
    gave identical noise while the record said "seeded with 63 bits".
    """
    entropy = iter([0x1234_5678, 0x1234_5678 + 2**32])
    current = {}

    def randbits(k):
        current["v"] = next(entropy)
        return current["v"]

    def urandom(n):
        return randbits(63).to_bytes(n, "little")

    monkeypatch.setattr(secrets, "randbits", randbits)
    monkeypatch.setattr(os, "urandom", urandom)
    draws = []
    for _ in range(2):
        gen = dpopt.os_entropy_generator()
        draws.append(
            privatize(torch.zeros(256), noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=1.0, generator=gen)
        )
    assert not torch.equal(draws[0], draws[1])


def test_record_names_the_generator_truthfully():
    name = dpopt.noise_generator_name("cpu")
    assert "ChaCha20" in name and "256 bits from os.urandom" in name and "cpu device" in name
    assert "mt19937" not in name and "Mersenne" not in name and "63 bits" not in name
    assert "cuda device" in dpopt.noise_generator_name("cuda")


def test_the_key_never_leaves_the_generator():
    gen = CsprngGaussian(key=RFC_KEY)
    assert RFC_KEY.hex() not in repr(gen) and "000102" not in repr(gen)
    for leak in (pickle.dumps, copy.deepcopy, copy.copy):
        with pytest.raises(TypeError):
            leak(gen)
    with pytest.raises(ValueError):
        CsprngGaussian(key=bytes(16))
    with pytest.raises(ValueError):
        gen.normal(4, float("nan"))


def test_chunked_draw_equals_one_piece(monkeypatch):
    """A draw larger than one host→device chunk is the same stream, cut in chunks (no repeated or skipped bytes)."""
    from dplora.mechanism import noise

    whole = CsprngGaussian(key=RFC_KEY).normal(1000, 1.0)
    monkeypatch.setattr(noise, "CHUNK_VALUES", 300)
    assert torch.equal(CsprngGaussian(key=RFC_KEY).normal(1000, 1.0), whole)


def test_optimizer_noisy_step_has_std_sigma_c_over_e():
    """An empty logical step through make_private and SGD(lr=1): the update is −noise/E, std σC/E within 4 SE."""
    sigma, clip, expected = 0.8, 2.5, 4.0
    lin = torch.nn.Linear(300, 300, bias=False)
    with torch.no_grad():
        lin.weight.zero_()
    plan = SimpleNamespace(noise_multiplier=sigma, max_grad_norm=clip, expected_batch_size=expected, sample_rate=0.1)
    _, dp_opt, accountant = dpopt.make_private(
        lin, torch.optim.SGD(lin.parameters(), lr=1.0), plan=plan, unit_mean=False
    )
    assert isinstance(dp_opt.generator, CsprngGaussian)
    dp_opt.begin_logical_step(0)
    dp_opt.step()
    step = -lin.weight.detach().reshape(-1).double()
    n, sd = step.numel(), sigma * clip / expected
    assert abs(float(step.mean())) < 4 * sd / math.sqrt(n)
    assert abs(float(step.std()) / sd - 1) < 4 / math.sqrt(2 * n)
    assert accountant.steps == 1 and dp_opt.generator.draws == 1
