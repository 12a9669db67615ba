"""Synthetic power-law graphs built directly as CSC, in bounded memory (benchmarks, scale tests).

Edge ``e`` has endpoints ``perm[floor(N * U^beta)]`` for two independent counter-based uniforms ``U``
(``beta > 1``), so node ranks get Zipf-like weights ``r^(1/beta - 1)`` and in- and out-degrees follow a
power law with tail exponent ``1 + beta / (beta - 1)`` (beta = 3: 2.5, like social graphs); a random
permutation spreads the hubs over the id space, and the same permutation for sources and destinations
correlates a node's in- and out-degree (a Chung-Lu-style model; multi-edges and self-loops are kept).

The graph is built in two passes over counter-based draws -- count in-degrees, then scatter sources --
so memory is the CSC itself (``8(N+1) + 4E`` bytes with int32 ids) plus one int64 [N] cursor, never
an edge list.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ooc.kernels.rng import batch_key, mix_key, rand_unit

__all__ = ["powerlaw_csc"]


@njit(cache=True, nogil=True, inline="always")
def _end(key: np.uint64, e: np.int64, side: np.int64, n: np.int64, beta: float) -> np.int64:
    x = np.int64(n * rand_unit(mix_key(key, 2 * e + side)) ** beta)
    return min(x, n - 1)


@njit(cache=True, nogil=True, parallel=True)
def _count(n: np.int64, m: np.int64, beta: float, key: np.uint64, perm: np.ndarray,
           nthreads: int) -> np.ndarray:
    part = np.zeros((nthreads, n), dtype=np.int64)
    chunk = (m + nthreads - 1) // nthreads
    for t in prange(nthreads):
        for e in range(t * chunk, min(m, (t + 1) * chunk)):
            part[t, perm[_end(key, e, 1, n, beta)]] += 1
    indptr = np.zeros(n + 1, dtype=np.int64)
    for v in range(n):
        c = 0
        for t in range(nthreads):
            c += part[t, v]
        indptr[v + 1] = indptr[v] + c
    return indptr


@njit(cache=True, nogil=True)
def _scatter(n: np.int64, m: np.int64, beta: float, key: np.uint64, perm: np.ndarray,
             indptr: np.ndarray, indices: np.ndarray) -> None:
    pos = indptr[:-1].copy()
    for e in range(m):
        d = perm[_end(key, e, 1, n, beta)]
        indices[pos[d]] = perm[_end(key, e, 0, n, beta)]
        pos[d] += 1


@njit(cache=True, nogil=True, parallel=True)
def _sort_lists(indptr: np.ndarray, indices: np.ndarray) -> None:
    for v in prange(indptr.shape[0] - 1):
        a = indptr[v]
        b = indptr[v + 1]
        if b - a > 1:
            indices[a:b] = np.sort(indices[a:b])


def powerlaw_csc(num_nodes: int, num_edges: int, beta: float = 3.0, seed: int = 0,
                 threads: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Power-law multigraph as CSC (see the module docstring).

    Args:
        num_nodes: N (< 2**31); num_edges: E; beta: skew (> 1; larger = heavier hubs);
        seed: generator seed; threads: counting threads (memory ``threads * 8N`` bytes).

    Returns:
        ``(indptr int64 [N+1], indices int32 [E])`` with sorted in-neighbour lists.

    Raises:
        ValueError: N outside ``[1, 2**31)`` or beta <= 1.
    """
    if not 1 <= num_nodes < 2**31:
        raise ValueError(f"num_nodes {num_nodes} outside [1, 2**31)")
    if beta <= 1:
        raise ValueError(f"beta must be > 1, got {beta}")
    key = batch_key(seed, 0, 0, stream=0x9A7)
    perm = np.random.default_rng([seed, 0x9E7]).permutation(num_nodes).astype(np.int32)
    indptr = _count(np.int64(num_nodes), np.int64(num_edges), float(beta), key, perm, max(1, threads))
    indices = np.empty(num_edges, dtype=np.int32)
    _scatter(np.int64(num_nodes), np.int64(num_edges), float(beta), key, perm, indptr, indices)
    _sort_lists(indptr, indices)
    return indptr, indices
