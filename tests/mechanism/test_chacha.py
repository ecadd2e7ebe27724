"""The torch ChaCha20 keystream (dplora.mechanism.chacha): RFC 8439 known answers, word-for-word equality with
``cryptography``'s stream (random keys, nonces, counters, lengths, the counter's 2³² limit), and the device-stream
noise path equal to the host path value for value (run on CPU, as a CUDA device would run it)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dplora.mechanism import noise
from dplora.mechanism.chacha import chacha20_blocks, chacha20_keystream_torch, chacha20_words64
from dplora.mechanism.noise import CsprngGaussian, chacha20_keystream, generator_name

RFC_KEY = bytes(range(32))
# RFC 8439 §2.3.2: nonce 00000009 0000004a 00000000, block counter 1, the serialised block.
RFC_232_NONCE = bytes.fromhex("000000090000004a00000000")
RFC_232_BLOCK = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
)
# RFC 8439 §2.4.2: nonce 00000000 0000004a 00000000, initial counter 1.
RFC_242_NONCE = bytes.fromhex("000000000000004a00000000")
RFC_242_PLAINTEXT = (
    b"Ladies and Gentlemen of the class of '99: "
    b"If I could offer you only one tip for the future, sunscreen would be it."
)
RFC_242_CIPHERTEXT = bytes.fromhex(
    "6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0b"
    "f91b65c5524733ab8f593dabcd62b3571639d624e65152ab8f530c359f0861d8"
    "07ca0dbf500d6a6156a38e088a22b65e52bc514d16ccf806818ce91ab7793736"
    "5af90bbf74a35be6b40b8eedf2785e42874d"
)


def test_block_function_matches_rfc8439_section_2_3_2():
    block = chacha20_blocks(RFC_KEY, RFC_232_NONCE, 1, 1)
    assert block.shape == (1, 16) and block.dtype == torch.int64
    assert int(block[0, 0]) == 0xE4E7F110 and int(block[0, 15]) == 0x4E3C50A2  # the RFC's state words 0 and 15
    assert chacha20_keystream_torch(RFC_KEY, RFC_232_NONCE, 64, counter=1) == RFC_232_BLOCK


def test_keystream_matches_rfc8439_section_2_4_2():
    stream = chacha20_keystream_torch(RFC_KEY, RFC_242_NONCE, len(RFC_242_PLAINTEXT), counter=1)
    assert bytes(p ^ k for p, k in zip(RFC_242_PLAINTEXT, stream, strict=True)) == RFC_242_CIPHERTEXT


def test_equal_to_cryptography_for_random_keys_nonces_counters_and_lengths():
    """40 random (key, nonce, counter, length) including lengths that end mid-block and counters near 2³²."""
    rng = random.Random(47)
    for case in range(40):
        key, nonce = rng.randbytes(32), rng.randbytes(12)
        nbytes = rng.choice([1, 63, 64, 65, 127, 128, 129, 640, rng.randrange(1, 1500)])
        nblocks = -(-nbytes // 64)
        counter = rng.randrange(0, 2**32 - nblocks + 1) if case % 2 else 2**32 - nblocks - rng.randrange(0, 3)
        got = chacha20_keystream_torch(key, nonce, nbytes, counter=counter)
        assert got == chacha20_keystream(key, nonce, nbytes, counter=counter), (case, counter, nbytes)


def test_the_32_bit_counter_ends_where_cryptography_ends():
    """Block 2³² − 1 is the last: both refuse one byte more (no wrap to 0, no carry into the nonce)."""
    key, nonce = bytes(range(1, 33)), bytes(range(12))
    last = chacha20_keystream(key, nonce, 64, counter=2**32 - 1)
    assert chacha20_keystream_torch(key, nonce, 64, counter=2**32 - 1) == last
    with pytest.raises(ValueError):
        chacha20_keystream(key, nonce, 65, counter=2**32 - 1)
    with pytest.raises(ValueError):
        chacha20_keystream_torch(key, nonce, 65, counter=2**32 - 1)
    with pytest.raises(ValueError):
        chacha20_blocks(key, nonce, 2**32 - 2, 3)
    with pytest.raises(ValueError):
        chacha20_blocks(key[:31], nonce, 0, 1)
    with pytest.raises(ValueError):
        chacha20_words64(key, nonce, -1, 4)


def test_64_bit_words_equal_numpy_view_of_the_stream_at_every_offset():
    """Words from any start (mid-block included) are the stream's little-endian int64 words, sign included."""
    key, nonce = bytes(range(100, 132)), bytes(range(7, 19))
    ref = np.frombuffer(chacha20_keystream(key, nonce, 64 * 6), dtype="<i8")
    assert (ref < 0).any() and (ref > 0).any()
    for first, count in [(0, 48), (1, 7), (7, 2), (8, 8), (13, 30), (47, 1), (5, 0)]:
        got = chacha20_words64(key, nonce, first, count)
        assert got.dtype == torch.int64
        np.testing.assert_array_equal(got.numpy(), ref[first : first + count])


@pytest.mark.parametrize("chunk", [None, 301, 64])
def test_device_stream_noise_equals_host_noise_value_for_value(monkeypatch, chunk):
    """The CUDA path (keystream computed by torch on the output's device), forced onto CPU, gives bit-identical
    noise to the cryptography path over 3 draws, also when the chunk starts mid-block (301 values)."""
    if chunk is not None:
        monkeypatch.setattr(noise, "CHUNK_VALUES", chunk)
    host = CsprngGaussian(key=RFC_KEY)
    expected = [host.normal(n, 1.7) for n in (700, 1, 333)]
    monkeypatch.setattr(noise, "DEVICE_STREAM_TYPES", frozenset({"cpu", "cuda"}))
    dev = CsprngGaussian(key=RFC_KEY)
    for want, n in zip(expected, (700, 1, 333), strict=True):
        got = dev.normal(n, 1.7)
        assert got.shape == (n,) and got.dtype == torch.float32
        assert torch.equal(got, want)
    assert dev.draws == 3
    assert dev.normal(0, 1.0).shape == (0,)


def test_generator_name_says_where_the_stream_is_computed():
    cpu, cuda = generator_name("cpu"), generator_name("cuda")
    assert cpu.startswith("ChaCha20 keystream (RFC 8439, the cryptography package) keyed with 256 bits")
    assert "torch integer ops on the cuda device" in cuda and "Box-Muller in fp64 on the cuda device" in cuda
    assert "torch integer ops" not in cpu


def test_the_generator_holds_no_more_than_key_draw_count_and_lock():
    """The device path adds no state: nothing key-derived is cached on the instance (the lock makes two threads take
    two nonces, red team issue 47)."""
    assert CsprngGaussian.__slots__ == ("_key", "_draws", "_lock")
