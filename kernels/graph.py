"""CSC / CSR construction from COO edge lists, and the kernels of the streaming (external-memory) build.

In memory: :func:`build_csc` (counting sort).  Streaming (driven by :mod:`ooc.ingest.streaming`):
:func:`count_into` (degree counting), :func:`bucket_scatter` (distribute a chunk into dst-range
buckets), :func:`local_csc` + :func:`sort_segments` (one bucket to CSC, neighbours sorted, optional
dedup, edge values carried along), :func:`merge_unique` (merge two sorted runs of ids).  Pairs are
never linearised into a ``src * N + dst`` key, which overflows int64 beyond ~3 billion nodes.

Convention: a graph is stored as CSC, i.e. the in-edges of node ``v`` are
``indices[indptr[v]:indptr[v+1]]`` (the source ids), sorted ascending within each node.  The out-CSR
of a graph is the CSC of its reversed edges.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["build_csc", "build_csr", "index_dtype_for", "INT32_LIMIT", "count_into", "bucket_scatter",
           "local_csc", "sort_segments", "merge_unique", "sort_edges", "unique_sorted",
           "self_loop_counts"]

#: Largest value stored in int32 arrays; tests may lower it to exercise the int64 paths.
INT32_LIMIT = 2**31 - 1


def index_dtype_for(num_nodes: int) -> np.dtype:
    """int32 when every node id fits (``num_nodes - 1 <= INT32_LIMIT``), else int64."""
    return np.dtype(np.int32) if num_nodes - 1 <= INT32_LIMIT else np.dtype(np.int64)


def degree_dtype_for(num_edges: int) -> np.dtype:
    """int32 when no degree can exceed it (``num_edges <= INT32_LIMIT``: a degree is at most the
    edge count), else int64."""
    return np.dtype(np.int32) if num_edges <= INT32_LIMIT else np.dtype(np.int64)


def degrees_into(indptr: np.ndarray, out: np.ndarray, step: int = 1 << 22) -> np.ndarray:
    """``out[v] = indptr[v + 1] - indptr[v]`` in slices of ``step`` nodes (no N-sized int64
    temporary when ``out`` is int32, see :func:`degree_dtype_for`); returns ``out``."""
    n = indptr.shape[0] - 1
    for a in range(0, n, step):
        b = min(a + step, n)
        out[a:b] = indptr[a + 1:b + 1] - indptr[a:b]
    return out


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


# ---------------------------------------------------------------- streaming-build kernels
@njit(cache=True, nogil=True)
def count_into(keys: np.ndarray, counts: np.ndarray) -> None:
    """``counts[keys[i]] += 1`` for every i (in place; keys must be in range)."""
    for i in range(keys.shape[0]):
        counts[keys[i]] += 1


@njit(cache=True, nogil=True)
def bucket_scatter(src: np.ndarray, dst: np.ndarray, weight: np.ndarray, bounds: np.ndarray,
                   num_buckets: int, out_src: np.ndarray, out_dst: np.ndarray,
                   out_weight: np.ndarray) -> np.ndarray:
    """Stable counting sort of one chunk of edges by the bucket of their destination.

    Args:
        src, dst: int [n] edges; weight: float32 [n] or [0] (no edge values).
        bounds: int64 [num_buckets + 1] node boundaries: bucket b holds destinations
            ``[bounds[b], bounds[b+1])``.  Found by binary search in this small (cache-resident)
            array, which is several times faster than a per-node lookup table of N entries.
        out_src, out_dst, out_weight: destinations of the same shapes as the inputs.

    Returns:
        int64 [num_buckets + 1] offsets: bucket b's edges are ``out_*[off[b]:off[b+1]]``, in input order.
    """
    n = src.shape[0]
    off = np.zeros(num_buckets + 1, dtype=np.int64)
    bucket = np.empty(n, dtype=np.int32)
    for i in range(n):
        v = dst[i]
        lo = 0
        hi = num_buckets
        while hi - lo > 1:  # largest b with bounds[b] <= v
            mid = (lo + hi) >> 1
            if bounds[mid] <= v:
                lo = mid
            else:
                hi = mid
        bucket[i] = lo
        off[lo + 1] += 1
    for b in range(num_buckets):
        off[b + 1] += off[b]
    pos = off[:-1].copy()
    has_w = weight.shape[0] > 0
    for i in range(n):
        b = bucket[i]
        p = pos[b]
        out_src[p] = src[i]
        out_dst[p] = dst[i]
        if has_w:
            out_weight[p] = weight[i]
        pos[b] = p + 1
    return off


@njit(cache=True, nogil=True)
def local_csc(src: np.ndarray, dst: np.ndarray, weight: np.ndarray, lo: int, pos: np.ndarray,
              out_src: np.ndarray, out_weight: np.ndarray) -> None:
    """Stable counting-sort scatter of edges by destination (destinations in ``[lo, lo + n)``).

    Args:
        pos: int64 [n] next write position of every destination (starts as its CSC offset; advanced
            in place, so a bucket can be fed in several chunks).
        out_src: [E_b] receives the sources grouped by destination; out_weight likewise (or [0]).
    """
    has_w = weight.shape[0] > 0
    for i in range(src.shape[0]):
        v = dst[i] - lo
        p = pos[v]
        out_src[p] = src[i]
        if has_w:
            out_weight[p] = weight[i]
        pos[v] = p + 1


@njit(cache=True, nogil=True)
def sort_segments(offsets: np.ndarray, idx: np.ndarray, weight: np.ndarray, dedup: bool) -> tuple:
    """Sort every segment ``idx[offsets[v]:offsets[v+1]]`` ascending (stably, weights carried along);
    with ``dedup`` keep the first of equal ids.  Compacts in place.

    Returns:
        ``(counts int64 [n], kept)``: entries per segment after dedup and the total kept; the result is
        ``idx[:kept]`` / ``weight[:kept]``.
    """
    n = offsets.shape[0] - 1
    counts = np.zeros(n, dtype=np.int64)
    has_w = weight.shape[0] > 0
    w = 0
    for v in range(n):
        a = offsets[v]
        b = offsets[v + 1]
        if b - a > 1:
            if has_w:
                order = np.argsort(idx[a:b], kind="mergesort")
                seg = idx[a:b][order]
                segw = weight[a:b][order]
                idx[a:b] = seg
                weight[a:b] = segw
            elif b - a <= 16:
                for i in range(a + 1, b):  # insertion sort: most segments are short
                    x = idx[i]
                    j = i - 1
                    while j >= a and idx[j] > x:
                        idx[j + 1] = idx[j]
                        j -= 1
                    idx[j + 1] = x
            else:
                idx[a:b].sort()
        start = w
        for i in range(a, b):
            if dedup and i > a and idx[i] == idx[i - 1]:
                continue
            idx[w] = idx[i]
            if has_w:
                weight[w] = weight[i]
            w += 1
        counts[v] = w - start
    return counts, w


@njit(cache=True, nogil=True)
def unique_sorted(a: np.ndarray) -> int:
    """Compact a sorted array in place to its distinct values; returns their count."""
    if a.shape[0] == 0:
        return 0
    w = 1
    for i in range(1, a.shape[0]):
        if a[i] != a[w - 1]:
            a[w] = a[i]
            w += 1
    return w


@njit(cache=True, nogil=True)
def merge_unique(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> int:
    """Merge two sorted, duplicate-free arrays into ``out`` (len >= len(a)+len(b)) without duplicates.

    Returns:
        The number of values written.
    """
    i = 0
    j = 0
    k = 0
    na = a.shape[0]
    nb = b.shape[0]
    while i < na and j < nb:
        x = a[i]
        y = b[j]
        if x < y:
            out[k] = x
            i += 1
        elif y < x:
            out[k] = y
            j += 1
        else:
            out[k] = x
            i += 1
            j += 1
        k += 1
    while i < na:
        out[k] = a[i]
        i += 1
        k += 1
    while j < nb:
        out[k] = b[j]
        j += 1
        k += 1
    return k


def sort_edges(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort edges lexicographically by ``(src, dst)``.

    Two stable passes (by ``dst``, then by ``src``; NumPy's ``lexsort``), so no combined
    ``src * N + dst`` key is formed and ids up to 2^63 - 1 sort correctly.

    Args:
        src, dst: integer arrays [E] of equal length.

    Returns:
        ``(src_sorted, dst_sorted)`` with the input dtypes.
    """
    src = np.asarray(src)
    dst = np.asarray(dst)
    if src.shape != dst.shape:
        raise ValueError(f"src and dst lengths differ: {src.shape} vs {dst.shape}")
    order = np.lexsort((dst, src))
    return src[order], dst[order]


@njit(cache=True, nogil=True)
def take_edges(pairs: np.ndarray, col_major: bool, num_nodes: int, shift: int, out_src: np.ndarray,
               out_dst: np.ndarray) -> tuple:
    """Copy, shift and validate one chunk of a COO pair array in a single pass.

    Args:
        pairs: int [m, 2] (``col_major`` false) or int [2, m] (true) slice of the input.
        num_nodes: N, or -1 when not declared (only negatives are then rejected).
        shift: subtracted from every id (1 for one-based inputs).
        out_src, out_dst: [m] outputs in the index dtype.

    Returns:
        ``(bad_row, bad_col, bad_value, max_id)``: the first row whose shifted id is negative or
        ``>= N`` (``-1`` if none) with its column (0 = source, 1 = destination) and raw value, and
        the largest shifted id seen.
    """
    m = pairs.shape[1] if col_major else pairs.shape[0]
    mx = np.int64(-1)
    for i in range(m):
        if col_major:
            s = np.int64(pairs[0, i]) - shift
            d = np.int64(pairs[1, i]) - shift
        else:
            s = np.int64(pairs[i, 0]) - shift
            d = np.int64(pairs[i, 1]) - shift
        if s < 0 or (num_nodes >= 0 and s >= num_nodes):
            return i, 0, s + shift, mx
        if d < 0 or (num_nodes >= 0 and d >= num_nodes):
            return i, 1, d + shift, mx
        if s > mx:
            mx = s
        if d > mx:
            mx = d
        out_src[i] = s
        out_dst[i] = d
    return -1, 0, 0, mx


@njit(cache=True, nogil=True)
def self_loop_counts(indptr: np.ndarray, indices: np.ndarray, first: int = 0) -> np.ndarray:
    """int32 [n]: the self-loops ``v -> v`` of every node of a CSC graph (one pass over the edges;
    GCN / GAT keep exactly one per node, see :func:`ooc.models.to_torch_blocks`).  ``indptr``
    [n+1] / ``indices`` may be one block of rows: node ``i`` of the block is node ``first + i``
    (``indptr`` relative to the block's first edge)."""
    n = indptr.shape[0] - 1
    out = np.zeros(n, dtype=np.int32)
    for v in range(n):
        for e in range(indptr[v], indptr[v + 1]):
            if indices[e] == first + v:
                out[v] += 1
    return out
