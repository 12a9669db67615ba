"""Product quantisation (PQ) of feature rows, as Numba kernels.

A row of ``D`` features is cut into ``M`` contiguous sub-vectors (subspace ``m`` = columns
``bounds[m]:bounds[m+1]``); each sub-vector is replaced by the index of its nearest of ``K <= 256``
centroids, learnt by k-means on a sample of rows, so a row costs ``M`` bytes instead of
``D * itemsize`` (Jegou, Douze & Schmid, "Product quantization for nearest neighbor search", TPAMI
2011).  ooc keeps the codes of every node in memory and decodes the rows a hybrid batch would
otherwise read from disk (see :mod:`ooc.features.pq`).

Codebooks are stored transposed, ``float32 [M, dmax, K]`` (``dmax`` = the widest subspace, unused
dimensions zero), so the distance loop runs over centroids in the inner loop (SIMD).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["subspace_bounds", "kmeans_subspace", "pq_encode", "pq_decode"]


def subspace_bounds(dim: int, subspaces: int) -> np.ndarray:
    """Column boundaries of ``subspaces`` near-equal contiguous subspaces of ``dim`` columns.

    Returns:
        int64 ``[M + 1]``, ``bounds[0] = 0``, ``bounds[M] = dim``; the first ``dim % M`` subspaces
        are one column wider.

    Raises:
        ValueError: ``subspaces`` outside ``[1, dim]``.
    """
    if not 1 <= subspaces <= dim:
        raise ValueError(f"PQ subspaces must be in [1, {dim}] (the feature dimension), got {subspaces}")
    q, r = divmod(dim, subspaces)
    widths = np.full(subspaces, q, dtype=np.int64)
    widths[:r] += 1
    return np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)


@njit(cache=True, nogil=True, parallel=True, fastmath=True)
def _assign(x: np.ndarray, cent_t: np.ndarray, norms: np.ndarray, out: np.ndarray) -> float:
    """Nearest centroid of every row of ``x`` [S, d] among ``cent_t`` [d, K]; returns the sum of
    squared distances."""
    s, d = x.shape
    k = cent_t.shape[1]
    total = np.zeros(s, dtype=np.float64)
    for i in prange(s):
        dist = norms.copy()
        for j in range(d):
            v = -2.0 * x[i, j]
            for c in range(k):
                dist[c] += v * cent_t[j, c]
        best = 0
        for c in range(1, k):
            if dist[c] < dist[best]:
                best = c
        out[i] = best
        xx = 0.0
        for j in range(d):
            xx += x[i, j] * x[i, j]
        total[i] = max(dist[best] + xx, 0.0)
    return total.sum()


@njit(cache=True, nogil=True)
def _cluster_sums(x: np.ndarray, labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster sums (float64 [k, d]) and counts (int64 [k]) of the rows of ``x``."""
    sums = np.zeros((k, x.shape[1]), dtype=np.float64)
    counts = np.zeros(k, dtype=np.int64)
    for i in range(x.shape[0]):
        c = labels[i]
        counts[c] += 1
        for j in range(x.shape[1]):
            sums[c, j] += x[i, j]
    return sums, counts


def kmeans_subspace(x: np.ndarray, k: int, iters: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Lloyd's k-means of the rows of ``x`` (float32 ``[S, d]``), started from ``k`` distinct
    random rows; an emptied cluster restarts at a random row.

    Returns:
        ``(centroids float32 [k, d], mean squared distance of the last assignment)``.

    Raises:
        ValueError: fewer rows than centroids.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    s, d = x.shape
    if s < k:
        raise ValueError(f"k-means needs at least {k} rows, got {s}")
    cent = x[rng.choice(s, size=k, replace=False)].copy()
    labels = np.empty(s, dtype=np.int64)
    err = 0.0
    for _ in range(max(iters, 1)):
        cent_t = np.ascontiguousarray(cent.T)
        err = _assign(x, cent_t, (cent * cent).sum(1).astype(np.float32), labels) / s
        sums, counts = _cluster_sums(x, labels, k)
        empty = counts == 0
        cent = (sums / np.maximum(counts, 1)[:, None]).astype(np.float32)
        if empty.any():
            cent[empty] = x[rng.choice(s, size=int(empty.sum()), replace=False)]
    return cent, float(err)


@njit(cache=True, nogil=True, parallel=True, fastmath=True)
def pq_encode(rows: np.ndarray, codebooks: np.ndarray, norms: np.ndarray, bounds: np.ndarray,
              out: np.ndarray) -> None:
    """Codes of ``rows`` [n, D] (any float dtype): ``out[i, m]`` = the centroid of subspace ``m``
    nearest to ``rows[i, bounds[m]:bounds[m+1]]``.

    Args:
        codebooks: float32 ``[M, dmax, K]`` (transposed centroids); norms: float32 ``[M, K]``,
            squared centroid norms; bounds: int64 ``[M + 1]``; out: uint8 ``[n, M]``.
    """
    n = rows.shape[0]
    m_count = codebooks.shape[0]
    k = codebooks.shape[2]
    for i in prange(n):
        dist = np.empty(k, dtype=np.float32)
        for m in range(m_count):
            for c in range(k):
                dist[c] = norms[m, c]
            a = bounds[m]
            for j in range(bounds[m + 1] - a):
                v = np.float32(-2.0) * np.float32(rows[i, a + j])
                for c in range(k):
                    dist[c] += v * codebooks[m, j, c]
            # the minimum first (a SIMD reduction), then its first position
            low = dist[0]
            for c in range(1, k):
                low = min(low, dist[c])
            best = 0
            while dist[best] != low:
                best += 1
            out[i, m] = best


@njit(cache=True, nogil=True)
def pq_decode(codes: np.ndarray, ids: np.ndarray, centroids: np.ndarray, bounds: np.ndarray,
              out: np.ndarray) -> None:
    """Approximate rows ``out[i] = concat_m centroids[m, codes[ids[i], m]]``.

    Args:
        codes: uint8 ``[N, M]``; ids: int64 ``[n]`` (each in ``[0, N)``, unchecked);
        centroids: ``[M, K, dmax]`` in the output dtype; bounds: int64 ``[M + 1]``;
        out: ``[n, D]``.
    """
    m_count = codes.shape[1]
    for i in range(ids.shape[0]):
        row = codes[ids[i]]
        for m in range(m_count):
            a = bounds[m]
            c = centroids[m, row[m]]
            for j in range(bounds[m + 1] - a):
                out[i, a + j] = c[j]
