"""Row gathers by node id from a table of sorted unique ids (the rows a read-ahead window staged).

The table is ``held`` (int64 [m], sorted, unique) and ``rows`` ([m, W] words, one row per id);
a lookup is one binary search per asked id and one row copy into the caller's output, in a single
pass without temporaries (the NumPy form -- ``searchsorted``, a mask, then two fancy-indexed
copies -- makes two extra copies of the found rows).  Rows are copied as words (8, 4, 2 or 1
bytes, the widest dividing the row), so any row dtype is copied bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["gather_sorted", "word_dtype", "word_view"]


@njit(cache=True, nogil=True)
def _gather_sorted(held: np.ndarray, rows: np.ndarray, ids: np.ndarray, out: np.ndarray,
                   found: np.ndarray) -> int:
    m = held.shape[0]
    w = rows.shape[1]
    hits = 0
    for i in range(ids.shape[0]):
        v = ids[i]
        lo, hi = 0, m
        while lo < hi:  # first position with held[pos] >= v
            mid = (lo + hi) >> 1
            if held[mid] < v:
                lo = mid + 1
            else:
                hi = mid
        if lo < m and held[lo] == v:
            found[i] = True
            hits += 1
            for k in range(w):
                out[i, k] = rows[lo, k]
        else:
            found[i] = False
    return hits


def word_dtype(row_bytes: int) -> np.dtype:
    """The widest unsigned word (8, 4, 2 or 1 bytes) dividing ``row_bytes`` (an int >= 0): rows of
    that size, and offsets that are multiples of it, can be copied word by word."""
    return next(np.dtype(w) for w in (np.uint64, np.uint32, np.uint16, np.uint8)
                if row_bytes % np.dtype(w).itemsize == 0)


def word_view(a: np.ndarray) -> np.ndarray:
    """``a`` ([n, ...], C-contiguous) as a 2-D array of its rows' bytes in the widest unsigned word
    (8, 4, 2 or 1 bytes) dividing a row: ``[n, row_bytes / word]``, a view (no copy).

    Raises:
        ValueError: ``a`` is not C-contiguous.
    """
    if not a.flags.c_contiguous:
        raise ValueError("rows must be C-contiguous to be copied as words")
    n = a.shape[0]
    row_bytes = a.dtype.itemsize * (int(np.prod(a.shape[1:])) if a.ndim > 1 else 1)
    return a.reshape(n, -1).view(np.uint8).reshape(n, row_bytes).view(word_dtype(row_bytes))


def gather_sorted(held: np.ndarray, rows: np.ndarray, ids: np.ndarray,
                  out: np.ndarray) -> tuple[np.ndarray, int]:
    """Copy the row of every ``ids[i]`` found in ``held`` into ``out[i]``.

    Args:
        held: int64 [m], sorted ascending, unique.
        rows: [m, ...] the row of each held id (C-contiguous).
        ids: int64 [n] ids to look up (any order, duplicates allowed).
        out: [n, ...] same dtype and row shape as ``rows`` (C-contiguous); rows of ids not found
            are left as they were.

    Returns:
        ``(found bool [n], hits)``: whether each id was held, and how many were.

    Raises:
        ValueError: the row shapes or dtypes of ``rows`` and ``out`` differ, or ``ids`` and
            ``out`` have different lengths.

    Cost: ``O(n log m)`` comparisons and one copy of each found row (no temporaries).
    """
    if rows.dtype != out.dtype or rows.shape[1:] != out.shape[1:]:
        raise ValueError(f"rows {rows.dtype} {rows.shape[1:]} and out {out.dtype} {out.shape[1:]} differ")
    if ids.shape[0] != out.shape[0]:
        raise ValueError(f"{ids.shape[0]} ids for {out.shape[0]} output rows")
    found = np.empty(ids.shape[0], dtype=np.bool_)
    if ids.shape[0] == 0:
        return found, 0
    if held.shape[0] == 0:
        found[:] = False
        return found, 0
    src, dst = word_view(rows), word_view(out)
    hits = _gather_sorted(np.ascontiguousarray(held, dtype=np.int64), src,
                          np.ascontiguousarray(ids, dtype=np.int64), dst, found)
    return found, int(hits)
