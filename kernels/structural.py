"""Structural node features of a featureless graph: log-degree and a random projection of the
adjacency rows (the node-embedding-free baseline features of LINKX, Lim et al., NeurIPS'21).

Row v of the projection is ``deg(v)^-1/2 * sum_{u in N(v)} r_u`` with ``r_u`` a vector of random
signs that is a pure function of (seed, u): ``D^-1/2 A R`` for a random sign matrix R, generated
on the fly (64 signs per splitmix64 draw), so R is never stored.  Nodes with similar neighbourhoods
get similar rows (Johnson-Lindenstrauss), and each entry has unit variance.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, uint64

from ooc.kernels.rng import mix_key

__all__ = ["structural_rows"]


@njit(cache=True, nogil=True, parallel=True)
def structural_rows(indptr: np.ndarray, indices: np.ndarray, lo: np.int64, base: np.int64,
                    key: np.uint64, out: np.ndarray) -> None:
    """Fill ``out`` (float32 [m, D], D >= 1) with the structural rows of nodes ``lo .. lo+m-1``.

    Args:
        indptr: int64 [N+1] CSC offsets; indices: the in-neighbour ids of these nodes, i.e.
            ``topology/indices[base : indptr[lo+m]]`` (``base = indptr[lo]``).
        lo: first node; base: offset of ``indices[0]`` in the full index array.
        key: seed key of the sign matrix.
        out: column 0 = ``log(1 + deg)``, columns 1.. = the projection.
    """
    m, d = out.shape
    k = d - 1
    words = (k + 63) // 64
    for r in prange(m):
        v = lo + r
        a = indptr[v] - base
        b = indptr[v + 1] - base
        deg = b - a
        for j in range(d):
            out[r, j] = 0.0
        out[r, 0] = np.log1p(np.float32(deg))
        if deg == 0 or k == 0:
            continue
        for e in range(a, b):
            u = np.int64(indices[e])
            for w in range(words):
                h = mix_key(key, u * words + w)
                j0 = w * 64
                for t in range(min(64, k - j0)):
                    if (h >> uint64(t)) & uint64(1):
                        out[r, 1 + j0 + t] += 1.0
                    else:
                        out[r, 1 + j0 + t] -= 1.0
        s = np.float32(1.0 / np.sqrt(np.float64(deg)))
        for j in range(1, d):
            out[r, j] *= s
