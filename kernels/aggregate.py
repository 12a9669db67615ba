"""Message-passing kernels over a block's edges in CSR form: sparse x dense products, their
transposes, per-edge dot products and per-row maxima, in parallel over rows.

A block's edges ``(src[e], dst[e])`` are held as a CSR over the rows the result is written to:
``indptr`` int64 [R+1] and, for position ``k`` of row ``r``'s range ``indptr[r]:indptr[r+1]``, the
column ``col[k]`` and the edge id ``eid[k]`` (an empty ``eid`` means ``eid[k] = k``).  Over
destinations (``col = src``) this gives the aggregation ``out[v] = sum_e w_e x[src_e]``; over sources
(the transpose, ``col = dst``) it gives that product's gradient with respect to ``x``.  Rows are
built by a stable counting sort (:func:`csr_by_key`), so every row lists its edges in ascending edge
id: each output row is summed by one thread in that fixed order, whatever the thread count -- the same
terms in the same order as a sequential ``index_add_`` over the edges, hence the same floats.

This is the row-parallel CSR SpMM of sparse BLAS (e.g. Intel MKL's ``mkl_sparse_s_mm``) and of DGL's
``SpMMCsr``; the gradient with respect to the edge weights is the sampled dense-dense product (SDDMM).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["csr_by_key", "spmm_csr", "sddmm_csr", "segment_max_csr"]


@njit(cache=True, nogil=True)
def csr_by_key(keys: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Group edge ids by key, stably: ``(indptr int64 [num_rows+1], eid int64 [E])`` with the edges
    of key ``r`` at ``eid[indptr[r]:indptr[r+1]]`` in ascending order (a counting sort, O(E + R)).

    Args:
        keys: int32|int64 [E], every value in ``[0, num_rows)`` (not checked).
        num_rows: number of rows ``R``.
    """
    m = keys.shape[0]
    indptr = np.zeros(num_rows + 1, dtype=np.int64)
    for e in range(m):
        indptr[keys[e] + 1] += 1
    for r in range(num_rows):
        indptr[r + 1] += indptr[r]
    pos = indptr[:-1].copy()
    eid = np.empty(m, dtype=np.int64)
    for e in range(m):
        r = keys[e]
        eid[pos[r]] = e
        pos[r] += 1
    return indptr, eid


@njit(cache=True, nogil=True, parallel=True)
def spmm_csr(indptr: np.ndarray, col: np.ndarray, eid: np.ndarray, w: np.ndarray, x: np.ndarray,
             out: np.ndarray) -> None:
    """``out[r, h, :] = sum_{k in row r} w[eid[k], h] * x[col[k], h, :]`` (without weights: the sum
    of the rows ``x[col[k]]``); rows without entries are 0.

    Args:
        indptr: int64 [R+1]; col: int32|int64 [K] rows of ``x``; eid: int64 [K] edge ids (empty:
            ``eid[k] = k``).
        w: float [E, H] edge weights, or an empty [0, H] array for none.
        x: float [S, H, F] (C-contiguous); out: float [R, H, F], written.

    Row ``r`` is accumulated by one thread, its entries in order, starting from 0: the result does
    not depend on the thread count.
    """
    rows = indptr.shape[0] - 1
    heads = x.shape[1]
    width = x.shape[2]
    has_w = w.shape[0] > 0
    has_e = eid.shape[0] > 0
    for r in prange(rows):
        for h in range(heads):
            for f in range(width):
                out[r, h, f] = 0.0
        for k in range(indptr[r], indptr[r + 1]):
            u = col[k]
            if has_w:
                e = eid[k] if has_e else k
                for h in range(heads):
                    a = w[e, h]
                    for f in range(width):
                        out[r, h, f] += a * x[u, h, f]
            else:
                for h in range(heads):
                    for f in range(width):
                        out[r, h, f] += x[u, h, f]


@njit(cache=True, nogil=True, parallel=True)
def sddmm_csr(indptr: np.ndarray, col: np.ndarray, eid: np.ndarray, g: np.ndarray, x: np.ndarray,
              out: np.ndarray) -> None:
    """``out[eid[k], h] = sum_f g[r, h, f] * x[col[k], h, f]`` for every entry ``k`` of every row
    ``r``: the gradient of :func:`spmm_csr` with respect to ``w`` when ``g`` is the output's gradient.

    Args:
        indptr, col, eid: the CSR over the rows of ``g`` (as in :func:`spmm_csr`).
        g: float [R, H, F]; x: float [S, H, F]; out: float [E, H], written at every edge id.
    """
    rows = indptr.shape[0] - 1
    heads = x.shape[1]
    width = x.shape[2]
    has_e = eid.shape[0] > 0
    for r in prange(rows):
        for k in range(indptr[r], indptr[r + 1]):
            u = col[k]
            e = eid[k] if has_e else k
            for h in range(heads):
                s = 0.0
                for f in range(width):
                    s += g[r, h, f] * x[u, h, f]
                out[e, h] = s


@njit(cache=True, nogil=True, parallel=True)
def segment_max_csr(indptr: np.ndarray, eid: np.ndarray, s: np.ndarray, out: np.ndarray) -> None:
    """``out[r, h] = max_{k in row r} s[eid[k], h]`` (``-inf`` for a row without entries, NaN for a
    row with a NaN).

    Args:
        indptr: int64 [R+1]; eid: int64 [K] (empty: ``eid[k] = k``); s: float [E, H];
        out: float [R, H], written.
    """
    rows = indptr.shape[0] - 1
    heads = s.shape[1]
    has_e = eid.shape[0] > 0
    for r in prange(rows):
        for h in range(heads):
            out[r, h] = -np.inf
        for k in range(indptr[r], indptr[r + 1]):
            e = eid[k] if has_e else k
            for h in range(heads):
                v = s[e, h]
                if v > out[r, h] or v != v:  # NaN propagates, as in torch's amax
                    out[r, h] = v
