"""Numba scans behind a dataset's structural checks (``Dataset.check_structure``).

Each is one sequential pass without temporaries, returning the position of the first violation
(-1 when there is none), so the caller can name the offending entry.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["first_decrease", "first_outside", "first_not_increasing", "first_common"]


@njit(cache=True, nogil=True)
def first_decrease(a: np.ndarray) -> int:
    """Smallest ``i`` with ``a[i + 1] < a[i]`` (a non-decreasing array gives -1)."""
    for i in range(a.shape[0] - 1):
        if a[i + 1] < a[i]:
            return i
    return -1


@njit(cache=True, nogil=True)
def first_outside(a: np.ndarray, lo: int, hi: int) -> int:
    """Smallest ``i`` with ``a[i] < lo`` or ``a[i] >= hi`` (-1: every entry in ``[lo, hi)``)."""
    for i in range(a.shape[0]):
        v = a[i]
        if v < lo or v >= hi:
            return i
    return -1


@njit(cache=True, nogil=True)
def first_not_increasing(a: np.ndarray) -> int:
    """Smallest ``i`` with ``a[i + 1] <= a[i]`` (-1: strictly increasing, i.e. sorted and unique)."""
    for i in range(a.shape[0] - 1):
        if a[i + 1] <= a[i]:
            return i
    return -1


@njit(cache=True, nogil=True)
def first_common(a: np.ndarray, b: np.ndarray) -> tuple:
    """``(count, first)`` of values in both sorted arrays ``a`` and ``b`` (merge; ``first`` = -1
    when there is none)."""
    i = 0
    j = 0
    count = 0
    first = -1
    while i < a.shape[0] and j < b.shape[0]:
        if a[i] < b[j]:
            i += 1
        elif b[j] < a[i]:
            j += 1
        else:
            if count == 0:
                first = a[i]
            count += 1
            i += 1
            j += 1
    return count, first
