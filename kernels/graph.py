"""CSC / CSR construction from COO edge lists (in memory; the streaming build lives in the converter).

Convention: a graph is stored as CSC, i.e. the in-edges of node ``v`` are
``indices[indptr[v]:indptr[v+1]]`` (the source ids), sorted ascending within each node.  The out-CSR
of a graph is the CSC of its reversed edges.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["build_csc", "build_csr", "index_dtype_for", "INT32_LIMIT"]

#: Largest value stored in int32 arrays; tests may lower it to exercise the int64 paths.
INT32_LIMIT = 2**31 - 1


def index_dtype_for(num_nodes: int) -> np.dtype:
    """int32 when every node id fits (``num_nodes - 1 <= INT32_LIMIT``), else int64."""
    return np.dtype(np.int32) if num_nodes - 1 <= INT32_LIMIT else np.dtype(np.int64)


@njit(cache=True, nogil=True)
def _count(keys: np.ndarray, n: int) -> np.ndarray:
    indptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(keys.shape[0]):
        indptr[keys[i] + 1] += 1
    for v in range(n):
        indptr[v + 1] += indptr[v]
    return indptr


@njit(cache=True, nogil=True)
def _scatter_sort(keys: np.ndarray, vals: np.ndarray, indptr: np.ndarray, out: np.ndarray) -> None:
    n = indptr.shape[0] - 1
    pos = indptr[:-1].copy()
    for i in range(keys.shape[0]):
        k = keys[i]
        out[pos[k]] = vals[i]
        pos[k] += 1
    for v in range(n):
        a = indptr[v]
        b = indptr[v + 1]
        if b - a > 1:
            out[a:b] = np.sort(out[a:b])


@njit(cache=True, nogil=True)
def _dedup(indptr: np.ndarray, indices: np.ndarray) -> tuple:
    n = indptr.shape[0] - 1
    new_ptr = np.zeros(n + 1, dtype=np.int64)
    w = 0
    for v in range(n):
        a = indptr[v]
        b = indptr[v + 1]
        for i in range(a, b):
            if i == a or indices[i] != indices[i - 1]:
                indices[w] = indices[i]
                w += 1
        new_ptr[v + 1] = w
    return new_ptr, indices[:w].copy()


def build_csc(src: np.ndarray, dst: np.ndarray, num_nodes: int, dedup: bool = False,
              index_dtype: np.dtype | None = None) -> tuple[np.ndarray, np.ndarray]:
    """CSC of the directed edges ``src[i] -> dst[i]`` by counting sort.

    Args:
        src, dst: integer arrays [E] of node ids in ``[0, num_nodes)`` (any order).
        num_nodes: N. Never inferred from the ids: isolated trailing nodes are kept.
        dedup: drop repeated (src, dst) pairs.
        index_dtype: dtype of ``indices``; default :func:`index_dtype_for` (int32 when N fits).

    Returns:
        ``(indptr int64 [N+1], indices [E'])`` with each node's in-neighbours sorted ascending.

    Raises:
        ValueError: an id is negative or ``>= num_nodes``, or src/dst lengths differ.
    """
    src = np.asarray(src)
    dst = np.asarray(dst)
    if src.shape != dst.shape or src.ndim != 1:
        raise ValueError(f"src and dst must be 1-D of equal length, got {src.shape} and {dst.shape}")
    for name, a in (("source", src), ("destination", dst)):
        if a.size and (a.min() < 0 or a.max() >= num_nodes):
            bad = a[(a < 0) | (a >= num_nodes)][0]
            raise ValueError(f"{name} node id {bad} outside [0, {num_nodes})")
    if index_dtype is None:
        index_dtype = index_dtype_for(num_nodes)
    dst64 = dst.astype(np.int64, copy=False)
    indptr = _count(dst64, num_nodes)
    indices = np.empty(src.shape[0], dtype=index_dtype)
    _scatter_sort(dst64, src.astype(index_dtype, copy=False), indptr, indices)
    if dedup:
        indptr, indices = _dedup(indptr, indices)
    return indptr, indices


def build_csr(src: np.ndarray, dst: np.ndarray, num_nodes: int, dedup: bool = False,
              index_dtype: np.dtype | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Out-CSR: ``indices[indptr[u]:indptr[u+1]]`` are the destinations of ``u``'s out-edges."""
    return build_csc(dst, src, num_nodes, dedup=dedup, index_dtype=index_dtype)
