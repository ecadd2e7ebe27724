"""The ChaCha20 keystream (RFC 8439 §2.3–2.4) in plain torch integer ops, vectorised over many blocks at once.

The same block function on any device: the 16 state words of every block are uint32 values held in int64 and
masked with 0xFFFFFFFF after each addition and rotation (torch.uint32 lacks most arithmetic), so the result is
bit-exact on CPU and CUDA alike. :class:`dplora.mechanism.noise.CsprngGaussian` uses it where the noise lands on a
CUDA device (the stream is made there instead of on one host thread and copied: 32 bytes per noise value); the
CPU path keeps ``cryptography``'s OpenSSL stream, which is faster on CPU (``scripts/bench_noise.py``).

Layout (RFC 8439 §2.3): words 0–3 the constants "expand 32-byte k", 4–11 the key (little-endian), 12 the 32-bit
block counter, 13–15 the 96-bit nonce (little-endian). The 32-bit counter never wraps: a request past block
2³² − 1 raises, as ``cryptography`` does ("the 32-bit counter portion of the nonce would overflow").

The key is turned into 8 words on the device and lives only in this process's (host or device) memory.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
BLOCK_BYTES = 64
BLOCK_WORDS = 16
COUNTER_LIMIT = 1 << 32  # blocks per (key, nonce): RFC 8439's 32-bit counter
CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k", RFC 8439 §2.3


def _rotl_(x: torch.Tensor, r: int) -> torch.Tensor:
    """x ⋘ r on uint32 values held in int64, in place: (x << r | x >> (32 − r)) & 0xFFFFFFFF."""
    high = x >> (32 - r)
    return x.mul_(1 << r).bitwise_or_(high).bitwise_and_(MASK32)


def _quarter_round_(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> None:
    """RFC 8439 §2.1's quarter round on four (…) int64 tensors of uint32 values, in place (views allowed)."""
    a.add_(b).bitwise_and_(MASK32)
    _rotl_(d.bitwise_xor_(a), 16)
    c.add_(d).bitwise_and_(MASK32)
    _rotl_(b.bitwise_xor_(c), 12)
    a.add_(b).bitwise_and_(MASK32)
    _rotl_(d.bitwise_xor_(a), 8)
    c.add_(d).bitwise_and_(MASK32)
    _rotl_(b.bitwise_xor_(c), 7)


def _words_le(data: bytes) -> list[int]:
    return [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]


def chacha20_blocks(
    key: bytes, nonce: bytes, counter: int, nblocks: int, *, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """ChaCha20 blocks ``counter`` … ``counter + nblocks − 1``: (nblocks, 16) int64, uint32 words in [0, 2³²).

    Word j of block i is bytes 4j … 4j + 3 (little-endian) of that block's 64 keystream bytes (RFC 8439 §2.3.2's
    serialisation). Computed on ``device`` with 20 rounds (10 column + diagonal double rounds) over all blocks at
    once, then the input state is added back (§2.3).

    Args:
        key: 32 bytes. nonce: 12 bytes (96-bit). counter: the first block counter, ≥ 0. nblocks: ≥ 0.

    Raises:
        ValueError: a key that is not 32 bytes, a nonce that is not 12 bytes, a negative count, or
            counter + nblocks > 2³² (the 32-bit counter would overflow; ``cryptography`` refuses the same).

    Source: RFC 8439 §2.1–2.3 (Nir & Langley 2018); Bernstein 2008, "ChaCha, a variant of Salsa20".
    """
    if len(key) != 32 or len(nonce) != 12:
        raise ValueError("ChaCha20 needs a 32-byte key and a 12-byte nonce")
    if counter < 0 or nblocks < 0 or counter + nblocks > COUNTER_LIMIT:
        raise ValueError(f"ChaCha20 blocks {counter}..{counter + nblocks} leave the 32-bit counter range [0, 2³²)")
    device = torch.device(device)
    fixed = torch.tensor(list(CONSTANTS) + _words_le(key) + [0] + _words_le(nonce), dtype=torch.int64, device=device)
    init = fixed.view(BLOCK_WORDS, 1).repeat(1, nblocks)  # (16, n): one column per block
    init[12] = torch.arange(counter, counter + nblocks, dtype=torch.int64, device=device)
    x = init.clone()
    rows = x.view(4, 4, nblocks)  # rows[r][c] is word 4r + c
    a, b, c, d = rows[0], rows[1], rows[2], rows[3]
    for _ in range(10):
        _quarter_round_(a, b, c, d)  # column rounds: QR(0,4,8,12) … QR(3,7,11,15), all four at once
        # diagonal rounds QR(0,5,10,15), QR(1,6,11,12), QR(2,7,8,13), QR(3,4,9,14): rotate rows b, c, d left by 1, 2, 3
        b2, c2, d2 = b.roll(-1, 0), c.roll(-2, 0), d.roll(-3, 0)
        _quarter_round_(a, b2, c2, d2)
        b.copy_(b2.roll(1, 0))
        c.copy_(c2.roll(2, 0))
        d.copy_(d2.roll(3, 0))
    return x.add_(init).bitwise_and_(MASK32).t().contiguous()


def chacha20_words64(
    key: bytes, nonce: bytes, first_word: int, nwords: int, *, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """64-bit little-endian stream words ``first_word`` … ``first_word + nwords − 1`` from block 0: (nwords,) int64.

    Word w is keystream bytes 8w … 8w + 7 read as a signed (two's-complement) little-endian int64: the same
    values as ``numpy.frombuffer(stream, "<i8")`` of ``cryptography``'s stream (8 such words per block).

    Raises:
        ValueError: as :func:`chacha20_blocks` (a range past block 2³² − 1, a bad key or nonce, a negative count).
    """
    if first_word < 0 or nwords < 0:
        raise ValueError(f"stream words from {first_word}, count {nwords}: both must be ≥ 0")
    block0, skip = divmod(first_word, 8)
    nblocks = -(-(skip + nwords) // 8)
    w = chacha20_blocks(key, nonce, block0, nblocks, device=device).view(-1, 2)  # (…, lo/hi uint32)
    hi = w[:, 1].bitwise_xor(1 << 31).sub_(1 << 31)  # the high half as a signed int32 value
    words = hi.mul_(1 << 32).add_(w[:, 0])  # hi·2³² + lo, exact (no overflow: hi ∈ [−2³¹, 2³¹))
    return words[skip : skip + nwords]


def chacha20_keystream_torch(
    key: bytes, nonce: bytes, nbytes: int, counter: int = 0, *, device: torch.device | str = "cpu"
) -> bytes:
    """``nbytes`` keystream bytes from block ``counter`` on, via :func:`chacha20_blocks` (for tests and benches).

    Raises:
        ValueError: as :func:`chacha20_blocks`; a negative ``nbytes``.
    """
    if nbytes < 0:
        raise ValueError(f"nbytes must be ≥ 0, got {nbytes}")
    nblocks = -(-nbytes // BLOCK_BYTES)
    words = chacha20_blocks(key, nonce, counter, nblocks, device=device).cpu()
    return words.numpy().astype("<u4").tobytes()[:nbytes]
