"""Attacks on the DP-SGD Gaussian noise (dplora.mechanism.noise, dplora.mechanism.chacha).

Each ``test_finding_*`` holds a fix (an empty draw crashed the host path, an int key became the all-zero key); each
``test_held_*`` is an attack that the code withstood, kept as a regression; the last two pin two threads taking one
nonce and ``__getstate__`` returning the key. References are independent of the code under test where it matters:
``cryptography``'s ChaCha20 (OpenSSL) for the keystream, numpy for the Box-Muller recipe, spies on the stream
constructors for nonce/counter reuse. The mechanism rule's attacks live in test_mechanism_rule_attacks.py.
"""

from __future__ import annotations

import ast
import copy
import math
import os
import pickle
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dplora.mechanism import chacha, noise
from dplora.mechanism import optimizer as dpopt
from dplora.mechanism.chacha import chacha20_blocks, chacha20_keystream_torch, chacha20_words64
from dplora.mechanism.noise import (
    BYTES_PER_VALUE,
    MAX_VALUES_PER_DRAW,
    CsprngGaussian,
    chacha20_keystream,
    generator_name,
    privatize,
)

ROOT = Path(__file__).resolve().parents[2]


KEY = bytes(range(7, 39))


def _ref_noise(key: bytes, draw: int, size: int, std: float) -> np.ndarray:
    """The documented recipe in numpy from cryptography's stream: nonce = draw, counter 0, words 4i..4i+3."""
    stream = chacha20_keystream(key, draw.to_bytes(12, "little"), size * BYTES_PER_VALUE)
    w = np.frombuffer(stream, "<i8").reshape(size, 2, 2)
    m = (w >> 11).astype(np.float64) + 2.0**52
    u1, u2 = (m[..., 0] + 1.0) * 2.0**-53, m[..., 1] * 2.0**-53
    r = np.sqrt(-2.0 * np.log(u1))
    z = r * np.cos(2 * np.pi * u2) + r * np.sin(2 * np.pi * u2)
    return ((z[:, 0] + z[:, 1]) * (0.5 * std)).astype(np.float32)


def test_finding_empty_draw_crashes_on_the_host_path_but_not_on_the_device_path(monkeypatch):
    """Guarantee 3 (empty tensors; device path == CPU path): a draw of 0 values on the CPU (cryptography) path
    raises ``ValueError: range() arg 3 must not be zero`` (``range(0, 0, chunk)`` with chunk = min(0, CHUNK) = 0)
    and burns a nonce; the device path (forced onto CPU) returns an empty tensor. privatize() of an empty
    clipped sum crashes the same way."""
    host = CsprngGaussian(key=KEY)
    got = host.normal(0, 1.0)  # ValueError today
    assert got.shape == (0,) and got.dtype == torch.float32
    assert privatize(
        torch.zeros(0), noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=1.0, generator=host
    ).shape == (0,)
    monkeypatch.setattr(noise, "DEVICE_STREAM_TYPES", frozenset({"cpu", "cuda"}))
    assert CsprngGaussian(key=KEY).normal(0, 1.0).shape == (0,)


def test_finding_an_int_key_silently_becomes_the_all_zero_key():
    """Guarantee 4 / the documented ``Raises: ValueError: a key that is not 32 bytes``: ``CsprngGaussian(32)``
    (an int, e.g. a caller who reads the positional argument as the key size) is accepted as ``bytes(32)``, the
    public all-zero key: every noise value is then predictable by anyone (equal to the zero-key stream)."""
    with pytest.raises((TypeError, ValueError)):
        gen = CsprngGaussian(32)  # accepted today
        # what it would mean: the noise is the public zero-key stream
        assert torch.equal(gen.normal(8, 1.0), CsprngGaussian(key=bytes(32)).normal(8, 1.0))


def test_held_torch_keystream_equals_cryptography_at_random_offsets_and_at_the_counter_end():
    """Guarantee 1: random keys/nonces, byte lengths 1..300 (not multiples of 64), counters uniform and within 3
    blocks of 2³²; 64-bit words from arbitrary word offsets incl. the last word of the 2³²-block stream."""
    rng = random.Random(4747)
    for case in range(24):
        key, nonce = rng.randbytes(32), rng.randbytes(12)
        nbytes = rng.randrange(1, 300)
        nblocks = -(-nbytes // 64)
        counter = rng.randrange(0, 2**32 - nblocks + 1) if case % 2 else 2**32 - nblocks - rng.randrange(0, 3)
        assert chacha20_keystream_torch(key, nonce, nbytes, counter) == chacha20_keystream(key, nonce, nbytes, counter)
    key, nonce = rng.randbytes(32), rng.randbytes(12)
    tail = np.frombuffer(chacha20_keystream(key, nonce, 128, counter=2**32 - 2), "<i8")  # the last 16 words
    first = (2**32 - 2) * 8
    for off in range(16):
        got = chacha20_words64(key, nonce, first + off, 16 - off).numpy()
        np.testing.assert_array_equal(got, tail[off:])
    mid = np.frombuffer(chacha20_keystream(key, nonce, 64 * 5, counter=123456789), "<i8")
    np.testing.assert_array_equal(chacha20_words64(key, nonce, 123456789 * 8 + 3, 33).numpy(), mid[3:36])


def test_held_no_wrap_at_the_end_of_the_32_bit_counter():
    """Guarantee 1: one word / one block past block 2³² − 1 is refused by every entry point (no wrap to block 0,
    no carry into the nonce); an empty request at the very end is allowed and empty."""
    key, nonce = bytes(32), bytes(12)
    last_word = 2**35 - 1
    assert chacha20_words64(key, nonce, last_word, 1).shape == (1,)
    for bad in (lambda: chacha20_words64(key, nonce, last_word, 2),
                lambda: chacha20_words64(key, nonce, 2**35, 1),
                lambda: chacha20_blocks(key, nonce, 2**32, 1),
                lambda: chacha20_blocks(key, nonce, 2**32 - 1, 2),
                lambda: chacha20_keystream_torch(key, nonce, 65, 2**32 - 1),
                lambda: chacha20_keystream(key, nonce, 65, 2**32 - 1),
                lambda: chacha20_keystream(key, nonce, 1, 2**32)):  # fmt: skip
        with pytest.raises(ValueError):
            bad()
    assert chacha20_words64(key, nonce, 2**35, 0).shape == (0,)
    # one draw's size bound is exactly one nonce's 2³² blocks, and one value more is refused
    assert MAX_VALUES_PER_DRAW * BYTES_PER_VALUE == 2**32 * 64
    with pytest.raises(ValueError):
        CsprngGaussian(key=KEY).normal(MAX_VALUES_PER_DRAW + 1, 1.0)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_held_every_value_noised_and_host_equals_device_across_odd_chunks(monkeypatch, chunk):
    """Guarantee 3: odd chunk sizes (1.5-block host chunks, mid-block device starts), odd totals: host ==
    device == unchunked == the numpy recipe, every value finite and non-zero (no zero/NaN tail)."""
    sizes = (1, 2, 5, 17, 129)
    whole = [t.numpy() for t in (lambda g: [g.normal(n, 2.0) for n in sizes])(CsprngGaussian(key=KEY))]
    monkeypatch.setattr(noise, "CHUNK_VALUES", chunk)
    host = CsprngGaussian(key=KEY)
    hosts = [host.normal(n, 2.0).numpy() for n in sizes]
    monkeypatch.setattr(noise, "DEVICE_STREAM_TYPES", frozenset({"cpu", "cuda"}))
    dev = CsprngGaussian(key=KEY)
    devs = [dev.normal(n, 2.0).numpy() for n in sizes]
    for d, (n, w, h, v) in enumerate(zip(sizes, whole, hosts, devs, strict=True)):
        np.testing.assert_array_equal(h, w)
        np.testing.assert_array_equal(v, w)
        np.testing.assert_allclose(w, _ref_noise(KEY, d, n, 2.0), rtol=1e-6, atol=1e-6)
        assert np.isfinite(w).all() and (w != 0).all()


def test_held_device_path_asks_for_disjoint_contiguous_word_ranges(monkeypatch):
    """Guarantee 2 (chunks of one step, device path): the words requested per chunk tile [0, 4·size) exactly once,
    under this draw's nonce; successive draws use successive nonces."""
    calls = []
    real = noise.chacha20_words64

    def spy(key, nonce, first, n, *, device):
        calls.append((nonce, first, n))
        return real(key, nonce, first, n, device=device)

    monkeypatch.setattr(noise, "chacha20_words64", spy)
    monkeypatch.setattr(noise, "CHUNK_VALUES", 13)
    monkeypatch.setattr(noise, "DEVICE_STREAM_TYPES", frozenset({"cpu", "cuda"}))
    gen = CsprngGaussian(key=KEY)
    for draw, size in enumerate((100, 13, 1)):
        calls.clear()
        gen.normal(size, 1.0)
        assert {c[0] for c in calls} == {draw.to_bytes(12, "little")}
        covered = sorted((f, f + n) for _, f, n in calls)
        assert covered[0][0] == 0 and covered[-1][1] == 4 * size
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:], strict=False))


def test_held_no_key_nonce_counter_reuse_across_steps_tensors_and_optimizers(monkeypatch):
    """Guarantee 2 (host path, through make_private): one ChaCha20 stream per logical step covering all
    tensors (one draw of P values), counter 0, nonce = step number, a fresh key per optimizer (a resumed
    or second run's engine); no (key, nonce) pair is ever used twice."""
    seen = []
    real = noise.algorithms.ChaCha20

    def spy(key, nonce16):
        seen.append((bytes(key), bytes(nonce16)))
        return real(key, nonce16)

    monkeypatch.setattr(noise.algorithms, "ChaCha20", spy)
    plan = SimpleNamespace(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=2.0, sample_rate=0.1)
    keys = []
    for _run in range(2):
        model = torch.nn.Sequential(torch.nn.Linear(5, 3, bias=True), torch.nn.Linear(3, 2, bias=False))
        _, dp_opt, _ = dpopt.make_private(
            model, torch.optim.SGD(model.parameters(), lr=1.0), plan=plan, unit_mean=False
        )
        start = len(seen)
        for _ in range(3):
            dp_opt.begin_logical_step(0)
            dp_opt.step()
        mine = seen[start:]
        assert len(mine) == 3  # one stream per step for all 4 tensors
        assert [n[:4] for _, n in mine] == [bytes(4)] * 3  # counter 0
        assert [int.from_bytes(n[4:], "little") for _, n in mine] == [0, 1, 2]
        keys.append(mine[0][0])
        assert len({k for k, _ in mine}) == 1
    assert keys[0] != keys[1]
    assert len(set(seen)) == len(seen)


def test_held_only_rank_0_draws_and_the_reduced_noise_has_std_sigma_c(monkeypatch):
    """Guarantees 2 and 3 across ranks: with the reduction simulated (all_reduce a no-op), rank 0 draws once per
    step (nonces 0, 1), a follower never touches its generator, and the reduced noise has std σC/E."""
    import torch.distributed as dist

    from dplora.engine.distributed import World
    from dplora.mechanism.clipping import UnitClipAccumulator
    from dplora.mechanism.reduction import StepReducer

    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None: None)
    P, sigma, clip, E = 100_000, 1.3, 0.7, 5.0
    gen = CsprngGaussian(key=KEY)
    reducer = StepReducer(World(rank=0, world_size=2, backend="gloo"), P, "cpu")
    acc = UnitClipAccumulator(P, clip, "cpu")
    outs = []
    for _ in range(2):
        acc.begin_step()
        outs.append(reducer.privatize(acc, noise_multiplier=sigma, max_grad_norm=clip, expected_batch_size=E,
                                      generator=gen).double())  # fmt: skip
    assert gen.draws == 2 and not torch.equal(outs[0], outs[1])
    sd = sigma * clip / E
    for out in outs:
        assert abs(float(out.std()) / sd - 1) < 4 / math.sqrt(2 * P)
        assert abs(float(out.mean())) < 4 * sd / math.sqrt(P)
    np.testing.assert_allclose(outs[1].numpy() * E, _ref_noise(KEY, 1, P, sigma * clip), rtol=1e-5, atol=1e-5)
    follower_gen = CsprngGaussian(key=KEY)
    follower = StepReducer(World(rank=1, world_size=2, backend="gloo"), P, "cpu")
    acc.begin_step()
    with pytest.raises(Exception, match="drawn 0 times"):  # the simulated reduction has no rank 0 part
        follower.privatize(acc, noise_multiplier=sigma, max_grad_norm=clip, expected_batch_size=E,
                           generator=follower_gen)  # fmt: skip
    assert follower_gen.draws == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_held_privatize_noises_every_coordinate_of_low_precision_and_strided_sums(dtype):
    """Guarantee 3: a bf16/fp16/fp32 clipped sum that is non-contiguous (a transposed matrix) gets fp32 noise on
    every coordinate, equal to the generator's own draw (std σC, not rounded to the input's dtype)."""
    clipped = torch.zeros(40, 30, dtype=dtype).t()  # non-contiguous (30, 40)
    assert not clipped.is_contiguous()
    out = privatize(clipped, noise_multiplier=2.0, max_grad_norm=1.5, expected_batch_size=1.0,
                    generator=CsprngGaussian(key=KEY))  # fmt: skip
    assert out.dtype == torch.float32 and out.shape == (30, 40)
    want = torch.from_numpy(_ref_noise(KEY, 0, 1200, 3.0)).view(30, 40)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    assert torch.isfinite(out).all() and (out != 0).all()


def test_held_the_key_is_the_whole_os_urandom_output_and_nothing_else(monkeypatch):
    """Guarantee 4: the production key is exactly one os.urandom(32) per generator (all 256 bits used: flipping
    the top bit of the last byte changes every value); make_private takes it from os.urandom."""
    asked = []
    real = os.urandom
    fixed = bytes(range(100, 132))

    def urandom(n):
        asked.append(n)
        return fixed if n == 32 else real(n)

    monkeypatch.setattr(noise.os, "urandom", urandom)
    gen = CsprngGaussian()
    assert asked == [32]
    a = gen.normal(256, 1.0)
    assert torch.equal(a, CsprngGaussian(key=fixed).normal(256, 1.0))
    flipped = fixed[:31] + bytes([fixed[31] ^ 0x80])
    assert (CsprngGaussian(key=flipped).normal(256, 1.0) != a).all()
    lin = torch.nn.Linear(2, 2)
    plan = SimpleNamespace(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=1.0, sample_rate=0.5)
    _, dp_opt, _ = dpopt.make_private(lin, torch.optim.SGD(lin.parameters(), lr=0.1), plan=plan, unit_mean=False)
    assert dp_opt.generator._key == fixed and asked == [32, 32]


def test_held_no_production_caller_can_choose_the_key():
    """Guarantee 4: every construction of CsprngGaussian in dplora/ and scripts/ passes no argument (the test-only
    ``key`` is never reachable from a contract or a CLI option)."""
    calls = []
    for folder in ("dplora", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                    if name == "CsprngGaussian":
                        calls.append((str(path.relative_to(ROOT)), node.lineno, len(node.args), len(node.keywords)))
    assert calls and all(a == 0 and k == 0 for *_, a, k in calls), calls


def test_held_the_key_does_not_leave_through_repr_pickle_copy_errors_or_the_record(monkeypatch):
    """Guarantee 4: repr/str, pickle (any protocol), copy, deepcopy, torch.save of the optimizer, every error
    message of the noise functions, the record's generator names: none holds the key bytes or hex."""
    import io

    gen = CsprngGaussian(key=KEY)
    marks = (KEY.hex(), KEY.hex()[:16], repr(KEY)[2:20])
    texts = [repr(gen), str(gen), generator_name("cpu"), generator_name("cuda")]
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        with pytest.raises(TypeError):
            pickle.dumps(gen, protocol=proto)
    for leak in (copy.copy, copy.deepcopy):
        with pytest.raises(TypeError):
            leak(gen)
    lin = torch.nn.Linear(2, 2)
    plan = SimpleNamespace(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=1.0, sample_rate=0.5)
    _, dp_opt, _ = dpopt.make_private(lin, torch.optim.SGD(lin.parameters(), lr=0.1), plan=plan, unit_mean=False)
    for obj in (dp_opt, dp_opt.state_dict()):  # the whole optimizer (Optimizer.__getstate__ drops the generator)
        buf = io.BytesIO()
        torch.save(obj, buf)
        assert dp_opt.generator._key not in buf.getvalue()
    texts.append(repr(dp_opt))
    for bad in (lambda: gen.normal(-1, 1.0), lambda: gen.normal(3, float("inf")),
                lambda: chacha20_blocks(KEY, bytes(12), 2**32, 1), lambda: chacha20_blocks(KEY, bytes(11), 0, 1),
                lambda: chacha20_words64(KEY, bytes(12), -1, 1), lambda: CsprngGaussian(key=KEY[:31])):  # fmt: skip
        with pytest.raises(ValueError) as info:
            bad()
        texts.append(str(info.value))
    for text in texts:
        assert not any(m in text for m in marks), text


def test_held_record_names_where_the_stream_is_computed(monkeypatch):
    """Guarantee 5: the name's stream part ("cryptography" vs "torch integer ops") agrees with the path normal()
    really takes for that device (spied), also when the device set is changed (CPU admitted)."""
    used = []
    real_words, real_cipher = noise.chacha20_words64, noise.Cipher
    monkeypatch.setattr(noise, "chacha20_words64", lambda *a, **k: used.append("torch") or real_words(*a, **k))
    monkeypatch.setattr(noise, "Cipher", lambda *a, **k: used.append("cryptography") or real_cipher(*a, **k))
    for admitted in (frozenset({"cuda"}), frozenset({"cpu", "cuda"})):
        monkeypatch.setattr(noise, "DEVICE_STREAM_TYPES", admitted)
        used.clear()
        CsprngGaussian(key=KEY).normal(10, 1.0, device="cpu")
        name = dpopt.noise_generator_name(torch.device("cpu"))
        assert used == [used[0]] and ("torch integer ops" in name) == (used[0] == "torch"), (used, name)
        assert ("the cryptography package)" in name) == (used[0] == "cryptography")
        assert "cpu device" in name and "256 bits from os.urandom" in name and "nonce = draw number" in name
    assert "torch integer ops on the cuda device" in generator_name("cuda:1")
    assert chacha.COUNTER_LIMIT == 2**32


def test_held_a_caller_mutating_its_key_buffer_changes_nothing():
    """Guarantee 4: the generator copies its key (a bytearray mutated after construction does not alter the
    stream), and draws are a pure function of (key, draw number)."""
    buf = bytearray(KEY)
    gen = CsprngGaussian(key=buf)
    buf[:] = bytes(32)
    np.testing.assert_allclose(gen.normal(64, 1.0).numpy(), _ref_noise(KEY, 0, 64, 1.0), rtol=1e-6, atol=1e-6)


def test_two_threads_drawing_at_once_take_distinct_nonces():
    """Two threads drawing at once: normal() read the draw count and then added 1 with no lock between; 8
    threads × 50 draws now take 400 distinct nonces (draws == 400 and every value differs)."""
    import threading

    from dplora.mechanism.noise import CsprngGaussian

    gen = CsprngGaussian(bytes(range(32)))
    out: list = []
    lock = threading.Lock()

    def work():
        for _ in range(50):
            v = gen.normal(4, 1.0)
            with lock:
                out.append(v)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gen.draws == 400
    assert len({tuple(v.tolist()) for v in out}) == 400


def test_the_generators_state_is_not_readable_through_getstate():
    """The key never leaves through __getstate__: object.__getstate__ of a slotted instance returned the key."""
    import pytest

    from dplora.mechanism.noise import CsprngGaussian

    with pytest.raises(TypeError, match="never pickled"):
        CsprngGaussian().__getstate__()
