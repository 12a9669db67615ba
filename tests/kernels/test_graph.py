"""Graph kernels (ooc.kernels.graph): dtypes and degree slices."""

from __future__ import annotations

import numpy as np

import ooc.kernels.graph as kg


def test_degree_dtype_and_slices() -> None:
    assert kg.degree_dtype_for(2**31 - 1) == np.int32 and kg.degree_dtype_for(2**31) == np.int64
    indptr = np.array([0, 3, 3, 10, 11], dtype=np.int64)
    out = np.empty(4, dtype=np.int32)
    assert kg.degrees_into(indptr, out, step=3).tolist() == [3, 0, 7, 1]
