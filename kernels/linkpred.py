"""Link-prediction sampling helpers: negative edges drawn uniformly or by degree, never true edges.

Negatives corrupt the destination of every positive (seed) edge ``(u, v)``: ``(u, v')`` with ``v'``
drawn uniformly from all nodes, or with probability proportional to ``deg(v')**power`` (degree-based,
the unigram^0.75 distribution of word2vec that PinSage and DGL's examples use).  With
``exclude_true=True`` a draw is rejected when ``u -> v'`` or ``v' -> u`` is an edge of the graph or
``v' == u``, and redrawn up to ``max_tries`` times; a negative that keeps failing is dropped (marked
``-1``), so a negative is never a true edge.  Edge membership is a binary search in the CSC
in-neighbour list, which is sorted ascending (the ``ooc.kernels.graph`` convention).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ooc.kernels.rng import mix_key, rand_below, rand_unit

__all__ = ["has_edge", "negative_destinations", "degree_cdf"]


@njit(cache=True, nogil=True)
def has_edge(indptr: np.ndarray, indices: np.ndarray, u: np.int64, v: np.int64) -> bool:
    """Whether the CSC graph has the edge ``u -> v`` (``u`` among ``v``'s sorted in-neighbours)."""
    lo = indptr[v]
    hi = indptr[v + 1]
    while lo < hi:
        mid = (lo + hi) >> 1
        if indices[mid] < u:
            lo = mid + 1
        else:
            hi = mid
    return lo < indptr[v + 1] and indices[lo] == u


def degree_cdf(indptr: np.ndarray, power: float = 0.75) -> np.ndarray:
    """float64 [N] cumulative distribution of ``deg**power`` (in-degrees) for degree-based negatives."""
    w = np.diff(indptr).astype(np.float64) ** power
    c = np.cumsum(w)
    if c.size == 0 or c[-1] <= 0:
        raise ValueError("degree-based negatives need at least one edge")
    return c / c[-1]


@njit(cache=True, nogil=True)
def negative_destinations(indptr: np.ndarray, indices: np.ndarray, src: np.ndarray, num_neg: int,
                          cdf: np.ndarray, exclude_true: bool, max_tries: int,
                          key: np.uint64) -> np.ndarray:
    """``num_neg`` negative destinations per source.

    Args:
        indptr, indices: CSC graph (N nodes); src: int64 [P] sources of the positive edges.
        num_neg: negatives per positive; cdf: float64 [N] from :func:`degree_cdf`, or empty for
            uniform draws; exclude_true: reject true edges (either direction) and ``v' == u``;
        max_tries: draws per negative before it is dropped; key: uint64 stream key.

    Returns:
        int64 [P * num_neg]: negative ``j`` of positive ``i`` at ``i * num_neg + j``; ``-1`` = dropped.
    """
    n = indptr.shape[0] - 1
    p = src.shape[0]
    out = np.full(p * num_neg, -1, dtype=np.int64)
    for i in range(p):
        u = src[i]
        for j in range(num_neg):
            k = mix_key(mix_key(key, i), j)
            for t in range(max_tries):
                kt = mix_key(k, t)
                if cdf.shape[0] > 0:
                    x = rand_unit(kt)
                    c = np.int64(np.searchsorted(cdf, x, side="right"))
                    if c >= n:
                        c = n - 1
                else:
                    c = rand_below(kt, n)
                if exclude_true and (c == u or has_edge(indptr, indices, u, c)
                                     or has_edge(indptr, indices, c, u)):
                    continue
                out[i * num_neg + j] = c
                break
    return out
