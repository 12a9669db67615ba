"""Counter-based random numbers for Numba kernels.

Every random draw is a pure function of a key, ``splitmix64(key)``: a sampler keyed by (seed, epoch,
batch, hop, node, draw) gives the same sample whatever the thread count or scheduling -- the property
reproducible parallel sampling needs (the same idea as Philox / "parallel random numbers: as easy as
1, 2, 3", Salmon et al., SC'11).  splitmix64 is Steele, Lea & Flood, "Fast splittable pseudorandom
number generators", OOPSLA'14.
"""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

__all__ = ["splitmix64", "mix_key", "mix_key_py", "rand_below", "rand_unit", "batch_key"]

@njit(cache=True, nogil=True, inline="always")
def splitmix64(x: np.uint64) -> np.uint64:
    """One splitmix64 output for state ``x`` (uint64 -> uint64)."""
    z = uint64(x) + uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> uint64(30))) * uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> uint64(27))) * uint64(0x94D049BB133111EB)
    return z ^ (z >> uint64(31))


@njit(cache=True, nogil=True, inline="always")
def mix_key(key: np.uint64, value: np.int64) -> np.uint64:
    """Derive a child key from ``key`` and an integer (hop, node id, draw index...)."""
    return splitmix64(uint64(key) ^ (uint64(value) * uint64(0xD6E8FEB86659FD93)))


@njit(cache=True, nogil=True, inline="always")
def rand_below(key: np.uint64, n: np.int64) -> np.int64:
    """Uniform integer in ``[0, n)`` from key (Lemire's multiply-shift on the high 32 bits; n < 2**32)."""
    r = splitmix64(key) >> uint64(32)
    return np.int64((r * uint64(n)) >> uint64(32))


@njit(cache=True, nogil=True, inline="always")
def distinct_below(key: np.uint64, n: np.int64, k: np.int64, out: np.ndarray, at: np.int64) -> None:
    """``k`` distinct integers of ``[0, n)`` (``k <= n``) into ``out[at:at + k]``, draw ``j`` keyed
    by ``mix_key(key, j)``: Robert Floyd's algorithm (Bentley & Floyd, "A sample of brilliance",
    CACM 1987), O(k^2) compares, no scratch.  The order is the algorithm's, not sorted."""
    c = 0
    for j in range(n - k, n):
        t = rand_below(mix_key(key, j), j + 1)
        dup = False
        for q in range(c):
            if out[at + q] == t:
                dup = True
                break
        out[at + c] = j if dup else t
        c += 1


@njit(cache=True, nogil=True, inline="always")
def rand_unit(key: np.uint64) -> np.float64:
    """Uniform float in ``[0, 1)`` with 53 random bits."""
    return np.float64(splitmix64(key) >> uint64(11)) * (1.0 / 9007199254740992.0)


_M64 = (1 << 64) - 1


def _splitmix64_py(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def mix_key_py(key: int, value: int) -> int:
    """Pure-Python twin of :func:`mix_key` (bit-identical)."""
    return _splitmix64_py((key & _M64) ^ (((value & _M64) * 0xD6E8FEB86659FD93) & _M64))


def batch_key(seed: int, epoch: int, batch: int, stream: int = 0) -> np.uint64:
    """Key of one batch's random stream, derived from (seed, epoch, batch index, stream id).

    The same inputs always give the same key, so a batch's sample is fixed by the run's seed and its
    position in the epoch, not by which thread or worker built it.
    """
    k = seed & _M64
    for v in (epoch, batch, stream):
        k = mix_key_py(k, v)
    return np.uint64(k)
