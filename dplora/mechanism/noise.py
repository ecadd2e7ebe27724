"""Cryptographically secure Gaussian noise for DP-SGD: ChaCha20 keystream → 53-bit uniforms → Box–Muller in fp64.

What Opacus's ``secure_mode`` intends (a CSPRNG, torchcsprng, plus the floating-point mitigation of Holohan &
Braghin 2021, arXiv 2107.10138, §5.1, n = 2: the sum of 2n = 4 Gaussian draws divided by 2), without torchcsprng:

- **Stream.** The ChaCha20 keystream (RFC 8439; ``cryptography``'s OpenSSL binding) under a 256-bit key from
  ``os.urandom``, drawn once per process and held only in memory: never stored, logged, pickled or printed. Draw
  number d (one per logical step) uses nonce d (96 bits, little-endian) and block counter 0, so no (key, nonce,
  counter) is reused and one draw may use up to 2³² blocks of 64 bytes.
- **Uniforms.** Each 64-bit little-endian word of the stream gives a uniform 53-bit integer m (its top 53 bits in
  offset binary: m = (word >> 11) XOR 2⁵², computed as the signed shift + 2⁵², exact in fp64):
  u₁ = (m + 1)·2⁻⁵³ ∈ (0, 1] for the radius (log u₁ is finite), u₂ = m·2⁻⁵³ ∈ [0, 1) for the angle; every value is
  an exact fp64 number (Box & Muller 1958).
- **Normals.** z = √(−2 ln u₁)·(cos 2πu₂, sin 2πu₂) in fp64; output value i uses words 4i … 4i + 3 (two pairs,
  so the result does not depend on chunking) and is (z₁ + z₂ + z₃ + z₄)/2 ~ N(0, 1), scaled by σC in fp64 and
  rounded once to fp32. 32 bytes of stream per output value.
- **Devices.** On CPU the stream comes from ``cryptography`` (OpenSSL, the fastest here). Where the output is on a
  device of :data:`DEVICE_STREAM_TYPES` (CUDA), the same stream is computed there by
  :mod:`dplora.mechanism.chacha` (RFC 8439's block function in torch integer ops, equal word for word; tested on
  CPU against ``cryptography``), so no stream bytes cross the host → device link. The shifts, logs and
  trigonometry run on the output's device either way (the same torch ops).

The accountant still assumes an ideal real-valued Gaussian; fp64 → fp32 sampling is an approximation of it
(Mironov 2012), as in every DP-SGD library (see ``execution.noise_floating_point_note`` in the release record).
"""

from __future__ import annotations

import math
import os
import threading

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from dplora.mechanism.chacha import chacha20_words64

KEY_BYTES = 32  # 256-bit ChaCha20 key
# Holohan & Braghin 2021 §5.1 with n = 2, as Opacus secure_mode: (z₁ + z₂ + z₃ + z₄) / 2 (the sum is written for 4)
SUMMED_DRAWS = 4
BYTES_PER_VALUE = 8 * SUMMED_DRAWS  # one 64-bit word per normal (two words per Box–Muller pair)
CHUNK_VALUES = 1 << 21  # output values per host → device copy: 64 MiB of stream
MAX_VALUES_PER_DRAW = (2**32 * 64) // BYTES_PER_VALUE  # the 32-bit block counter of one nonce
_MANTISSA = (1 << 53) - 1
_TWO_POW_MINUS_53 = 2.0**-53

DEVICE_STREAM_TYPES = frozenset({"cuda"})  # output devices whose keystream is computed there (dplora.mechanism.chacha)
STREAM_NAMES = {
    "host": "RFC 8439, the cryptography package",
    "device": "RFC 8439, computed in torch integer ops on the {device} device, equal word for word to the "
    "cryptography package's",
}
GENERATOR_NAME = (
    "ChaCha20 keystream ({stream}) keyed with 256 bits from os.urandom per process, "
    "never stored; nonce = draw number; 53-bit uniforms, Box-Muller in fp64 on the {device} device, "
    "(z1 + z2 + z3 + z4) / 2 as Opacus secure_mode (Holohan & Braghin 2021), scaled by sigma*C, rounded to fp32"
)


def chacha20_keystream(key: bytes, nonce: bytes, nbytes: int, counter: int = 0) -> bytes:
    """``nbytes`` bytes of the ChaCha20 keystream (RFC 8439 §2.4) from block ``counter`` on.

    Args:
        key: 32 bytes.
        nonce: 12 bytes (RFC 8439's 96-bit nonce).
        nbytes: bytes wanted, ≥ 0.
        counter: the first 32-bit block counter (RFC 8439's test vectors start at 1; dplora uses 0).

    Raises:
        ValueError: a key that is not 32 bytes, a nonce that is not 12 bytes, a counter outside [0, 2³²).

    Source: ``cryptography.hazmat.primitives.ciphers.algorithms.ChaCha20``, whose 16-byte nonce is the
    little-endian counter followed by the 12-byte nonce; encrypting zeros yields the keystream.
    """
    if len(key) != KEY_BYTES or len(nonce) != 12 or not 0 <= counter < 2**32:
        raise ValueError("ChaCha20 needs a 32-byte key, a 12-byte nonce and a 32-bit counter")
    encryptor = Cipher(algorithms.ChaCha20(key, counter.to_bytes(4, "little") + nonce), mode=None).encryptor()
    return encryptor.update(bytes(nbytes))


def box_muller_pair_sums_fp64(words: torch.Tensor) -> torch.Tensor:
    """z₁ + z₂ of one Box–Muller pair per two 64-bit stream words, in fp64: (…, 2) int64 → (…), each ~ N(0, 2).

    Word 0 of a pair gives the radius u₁ = (m₀ + 1)·2⁻⁵³ ∈ (0, 1], word 1 the angle u₂ = m₁·2⁻⁵³ ∈ [0, 1) (53-bit m:
    the word's top 53 bits, offset binary); (z₁, z₂) = r·(cos 2πu₂, sin 2πu₂), r = √(−2 ln u₁), two independent
    N(0, 1) (Box & Muller 1958), returned summed as r·(cos 2πu₂ + sin 2πu₂). Runs on ``words``' device.

    Raises:
        ValueError: a last dimension that is not 2.
    """
    if words.shape[-1] != 2:
        raise ValueError(f"Box-Muller takes words in pairs (…, 2), got shape {tuple(words.shape)}")
    # word >> 11 (arithmetic) is the top 53 bits as a signed integer in [−2⁵², 2⁵²); + 2⁵² maps it onto [0, 2⁵³).
    # Every step below up to the log is exact in fp64 (|values| ≤ 2⁵³, scaling by a power of 2).
    radius = (words[..., 0] >> 11).to(torch.float64).add_(2.0**52 + 1.0).mul_(_TWO_POW_MINUS_53)  # u₁
    radius = radius.log_().mul_(-2.0).sqrt_()
    angle = (words[..., 1] >> 11).to(torch.float64).add_(2.0**52).mul_(2.0 * math.pi * _TWO_POW_MINUS_53)
    return torch.cos(angle).add_(angle.sin_()).mul_(radius)


class CsprngGaussian:
    """Gaussian noise from a ChaCha20 keystream under a 256-bit key from ``os.urandom`` (see module docstring).

    One instance per process; the key never leaves it (no ``repr``, no pickling, no copy).

    Args:
        key: 32 bytes; only for tests (known-answer and key-flip tests). Production passes None: ``os.urandom(32)``.

    Raises:
        ValueError: a key that is not 32 bytes.
    """

    __slots__ = ("_key", "_draws", "_lock")

    def __init__(self, key: bytes | None = None):
        if key is None:
            key = os.urandom(KEY_BYTES)
        elif not isinstance(key, (bytes, bytearray, memoryview)):  # bytes(32) would be the public all-zero key
            raise ValueError(f"the noise key must be {KEY_BYTES} bytes, got a {type(key).__name__}")
        key = bytes(key)
        if len(key) != KEY_BYTES:
            raise ValueError(f"the noise key must be {KEY_BYTES} bytes, got {len(key)}")
        self._key = key
        self._draws = 0
        self._lock = threading.Lock()  # two threads never take the same nonce

    @property
    def draws(self) -> int:
        """Draws made so far (each used one nonce)."""
        return self._draws

    def normal(self, size: int, std: float, *, device: torch.device | str = "cpu") -> torch.Tensor:
        """One draw of ``size`` i.i.d. N(0, std²) values, shape (size,) fp32 on ``device`` (std in gradient units).

        Uses nonce = this instance's draw number, so two draws never share keystream.

        Raises:
            ValueError: size < 0, a non-finite or negative std, or size > 2³²·64 / 32 bytes (one nonce's stream).
        """
        if size < 0 or size > MAX_VALUES_PER_DRAW:
            raise ValueError(f"one noise draw holds 0..{MAX_VALUES_PER_DRAW} values, asked for {size}")
        if not (math.isfinite(std) and std >= 0):
            raise ValueError(f"noise std must be finite and ≥ 0, got {std}")
        with self._lock:
            nonce = self._draws.to_bytes(12, "little")
            self._draws += 1
        out = torch.empty(size, dtype=torch.float32, device=device)
        if size == 0:  # an empty draw on either path (its nonce is spent all the same)
            return out
        if out.device.type in DEVICE_STREAM_TYPES:
            return self._normal_device_stream(out, nonce, std)
        encryptor = Cipher(algorithms.ChaCha20(self._key, bytes(4) + nonce), mode=None).encryptor()
        chunk = min(size, CHUNK_VALUES)
        zeros = bytes(chunk * BYTES_PER_VALUE)
        host = bytearray(chunk * BYTES_PER_VALUE + 64)  # + 64 bytes: update_into's slack
        host_words = np.frombuffer(host, dtype="<i8")  # little-endian 64-bit words, a view (no copy)
        for start in range(0, size, chunk):
            k = min(chunk, size - start)
            nbytes = k * BYTES_PER_VALUE
            encryptor.update_into(memoryview(zeros)[:nbytes], host)
            words = torch.from_numpy(host_words[: k * SUMMED_DRAWS]).to(device)
            pairs = box_muller_pair_sums_fp64(words.view(k, 2, 2))  # value i: words 4i … 4i + 3, two pairs
            # (z₁ + z₂ + z₃ + z₄) / 2 · σC in fp64, then one fp32 rounding
            out[start : start + k] = pairs[:, 0].add_(pairs[:, 1]).mul_(0.5 * std)
        return out

    def _normal_device_stream(self, out: torch.Tensor, nonce: bytes, std: float) -> torch.Tensor:
        """Fill ``out`` (size,) fp32 from the keystream computed on ``out``'s device: the same words, so the same
        values as the host path (words 4i … 4i + 3 for value i, counter 0 at word 0)."""
        size = out.numel()
        chunk = min(size, CHUNK_VALUES)
        for start in range(0, size, max(chunk, 1)):
            k = min(chunk, size - start)
            words = chacha20_words64(self._key, nonce, start * SUMMED_DRAWS, k * SUMMED_DRAWS, device=out.device)
            pairs = box_muller_pair_sums_fp64(words.view(k, 2, 2))
            out[start : start + k] = pairs[:, 0].add_(pairs[:, 1]).mul_(0.5 * std)
        return out

    def __repr__(self) -> str:
        return f"CsprngGaussian(ChaCha20, 256-bit key from os.urandom, {self._draws} draws)"

    def __reduce__(self):
        raise TypeError("the noise generator holds a secret key and is never pickled, copied or stored")

    def __getstate__(self):
        raise TypeError("the noise generator holds a secret key and is never pickled, copied or stored")

    def __deepcopy__(self, memo):
        raise TypeError("the noise generator holds a secret key and is never pickled, copied or stored")

    def __copy__(self):
        raise TypeError("the noise generator holds a secret key and is never pickled, copied or stored")


def generator_name(device: torch.device | str) -> str:
    """The noise generator in words, for the release record's ``execution.noise_generator``: names where the
    keystream is computed (``cryptography`` on the host, or torch integer ops on a CUDA device) and the device of
    the Box–Muller transform."""
    kind = torch.device(device).type
    stream = STREAM_NAMES["device" if kind in DEVICE_STREAM_TYPES else "host"].format(device=kind)
    return GENERATOR_NAME.format(stream=stream, device=kind)


def privatize(
    clipped_sum: torch.Tensor,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    expected_batch_size: float,
    generator: CsprngGaussian,
) -> torch.Tensor:
    """(clipped_sum + N(0, (σC)² I)) / E, one noise draw of P values: the noisy mean gradient (P,) fp32.

    ``generator`` is this process's :class:`dplora.mechanism.noise.CsprngGaussian` (ChaCha20 keyed from ``os.urandom``;
    :func:`dplora.mechanism.optimizer.os_entropy_generator`), never a recorded seed; the noise is made on
    ``clipped_sum``'s
    device. E is the public expected number of units per step, never the realised count (Abadi et al. 2016, Alg. 1).
    """
    std = noise_multiplier * max_grad_norm
    noise = generator.normal(clipped_sum.numel(), std, device=clipped_sum.device).view(clipped_sum.shape)
    return (clipped_sum + noise).div_(expected_batch_size)
